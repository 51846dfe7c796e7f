#!/usr/bin/env python3
"""Which of a project's signals tell the wrong endings a blind reader rejected: broken ones
(ungrammatical or holding a non-word) and ones that could also follow (a second plausible ending).

    python3 scripts/blind_signals.py SHEET_PREFIX [SHEET_PREFIX ...] [--key-dir DIR]
        [--project EXPORT_DIR=PROJECT.sqlite ...] [--scoring-input OUT.json] [--scores IN.json]

Each SHEET_PREFIX names a reading made with `scripts/blind_sheet.py` and filled in by a reader:
PREFIX.sheet.md, PREFIX.answers.csv and PREFIX.key.json (the key from --key-dir when it is kept
elsewhere). Every wrong ending on the sheets is joined to its project's stored signals: the
project is the `--project` given for its export folder, else the `*.sqlite` beside that folder.
A wrong ending read on two sheets counts twice (once per judgement).

Signals, each relative to the question's real ending (its value minus the real ending's):
- gen_cond, gen_alone: the generator's mean log-probability per token after the context and
  alone (`afkit generate`);
- scorer_cond, scorer_alone: the scorer model's, per token (`afkit filter`'s scorer);
- reader_cond: the fluency reader's after the context, where `filter --fluency-reader` ran;
- model_cond, model_alone: any model's, per token, from --scores (below), and
  model_worst_cond, model_worst_alone: the log-probability of its most surprising token (alone:
  after the first);
- words: the ending's length in words (absolute).

For each export, and for all of them together, it prints the AUC of each signal for each judgement (0.5: no information; under
0.5: lower values mark the judged endings), then a logistic regression on all the signals it
has, cross-validated with folds by context, and what dropping the endings it rates riskiest
would leave: the share of the remaining wrong endings judged broken or plausible, and 1 - (1 -
share)^3, roughly the share of three-distractor questions that would hold one.

--scoring-input OUT.json writes the judged questions for
`cargo run --release -p afkit-engine --example score_endings -- MODEL.gguf OUT.json SCORES.json`;
--scores SCORES.json then adds that model's columns.

Read-only: the projects may be in use.
"""
import argparse
import bisect
import collections
import csv
import glob
import json
import math
import os
import random
import re
import sqlite3
import sys

LETTERS = "ABCD"
RELATIVE = ["gen_cond", "gen_alone", "scorer_cond", "scorer_alone", "reader_cond",
            "model_cond", "model_alone", "model_worst_cond", "model_worst_alone"]
SIGNALS = RELATIVE + ["words"]
JUDGEMENTS = ("broken", "plausible")


def letters(text):
    return set((text or "").replace(",", " ").upper().split())


def normalised(text):
    return " ".join(text.split())


def sheet_endings(path):
    """question number -> (its context, {letter: ending text}), from a sheet's markdown."""
    questions = {}
    for block in re.split(r"\n## ", open(path, encoding="utf-8").read())[1:]:
        lines = block.strip().split("\n")
        context = normalised(lines[2].removesuffix("…")) if len(lines) > 2 else ""
        endings = {}
        for line in lines:
            m = re.match(r"- \*\*([A-D])\*\* … (.*)", line)
            if m:
                endings[m.group(1)] = m.group(2)
        questions[int(lines[0])] = (context, endings)
    return questions


def judged_endings(prefix, key_dir):
    """One row per wrong ending on the sheet: its export folder, text and judgements."""
    key_path = os.path.join(key_dir, os.path.basename(prefix) + ".key.json") if key_dir \
        else prefix + ".key.json"
    key = json.load(open(key_path, encoding="utf-8"))
    sheet = sheet_endings(prefix + ".sheet.md")
    with open(prefix + ".answers.csv", newline="", encoding="utf-8") as f:
        answers = {int(row["question"]): row for row in csv.DictReader(f)}
    rows = []
    for q in key["questions"]:
        answer = answers.get(q["question"])
        if answer is None or not (answer.get("pick") or "").strip():
            continue
        broken = letters(answer["ungrammatical"])
        plausible = letters(answer["also_plausible"]) | letters(answer["pick"])
        export = os.path.dirname(q["file"])
        context, endings = sheet[q["question"]]
        for letter, text in endings.items():
            if letter != q["answer"]:
                rows.append({"sheet": prefix, "export": export, "context": context, "text": text,
                             "broken": letter in broken, "plausible": letter in plausible})
    return rows


def project_of(export, given):
    if export in given:
        return given[export]
    found = glob.glob(os.path.join(os.path.dirname(export), "*.sqlite"))
    if len(found) != 1:
        sys.exit(f"{export}: cannot tell its project ({len(found)} *.sqlite beside it); "
                 f"pass --project {export}=PROJECT.sqlite")
    return found[0]


def stored_signals(path):
    """(context, text) -> (example id, signals) for every wrong ending of the project; the real
    endings' own values, and their texts, under each example id."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    reader = "(SELECT ll_cond * 1.0 / n_tok FROM fluency_scores f WHERE f.ending_id = e.id)" \
        if "fluency_scores" in tables else "NULL"
    query = f"""SELECT e.text, e.example_id, e.is_gold, e.lp_cond, e.lp_alone,
                       s.ll_cond * 1.0 / s.n_tok, s.ll_alone * 1.0 / s.n_tok, {reader}
                FROM endings e LEFT JOIN scorer_scores s ON s.ending_id = e.id"""
    contexts = {i: normalised(f"{s1} {s2}") for i, s1, s2 in
                db.execute("SELECT id, sent1, sent2 FROM examples")}
    endings, gold, gold_texts = {}, {}, {}
    for text, example, is_gold, *values in db.execute(query):
        signals = dict(zip(["gen_cond", "gen_alone", "scorer_cond", "scorer_alone",
                            "reader_cond"], values))
        if is_gold:
            gold[example], gold_texts[example] = signals, text
        else:
            endings[(contexts[example], text)] = (example, signals)
    return endings, gold, gold_texts


def auc(positives, negatives):
    """P(a positive's value > a negative's), ties half; None without both."""
    if not positives or not negatives:
        return None
    negatives = sorted(negatives)
    total = 0.0
    for p in positives:
        below, up_to = bisect.bisect_left(negatives, p), bisect.bisect_right(negatives, p)
        total += below + 0.5 * (up_to - below)
    return total / (len(positives) * len(negatives))


def standardised(rows, names):
    for name in names:
        values = [r[name] for r in rows]
        mean = sum(values) / len(values)
        sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values)) or 1.0
        for r in rows:
            r.setdefault("x", [1.0]).append((r[name] - mean) / sd)


def logistic_fit(rows, label, l2=0.01, steps=300, rate=0.5):
    w = [0.0] * len(rows[0]["x"])
    for _ in range(steps):
        grad = [0.0] * len(w)
        for r in rows:
            p = 1 / (1 + math.exp(-sum(a * b for a, b in zip(w, r["x"]))))
            for i, x in enumerate(r["x"]):
                grad[i] += (p - r[label]) * x
        w = [wi - rate * (g / len(rows) + l2 * wi) for wi, g in zip(w, grad)]
    return w


def cross_validated_risk(rows, folds=5, seed=1):
    """Each row's predicted probability of each judgement from a model fit without its context."""
    contexts = sorted({r["context"] for r in rows})
    random.Random(seed).shuffle(contexts)
    fold = {c: i % folds for i, c in enumerate(contexts)}
    for label in JUDGEMENTS:
        for k in range(folds):
            w = logistic_fit([r for r in rows if fold[r["context"]] != k], label)
            for r in rows:
                if fold[r["context"]] == k:
                    z = sum(a * b for a, b in zip(w, r["x"]))
                    r["risk_" + label] = 1 / (1 + math.exp(-z))


def report(export, rows):
    print(f"\n## {export}: {len(rows)} judged wrong endings, "
          f"{sum(r['broken'] for r in rows)} broken, {sum(r['plausible'] for r in rows)} plausible")
    names = [s for s in SIGNALS if all(r.get(s) is not None for r in rows)]
    print("| signal | " + " | ".join(f"AUC {j}" for j in JUDGEMENTS) + " |")
    print("| --- | ---: | ---: |")
    for name in names:
        cells = [auc([r[name] for r in rows if r[j]], [r[name] for r in rows if not r[j]])
                 for j in JUDGEMENTS]
        print(f"| {name} | " + " | ".join("–" if c is None else f"{c:.2f}" for c in cells) + " |")
    if len({r["context"] for r in rows}) < 10 or not all(
            any(r[j] for r in rows) for j in JUDGEMENTS):
        return
    standardised(rows, names)
    for r in rows:
        for j in JUDGEMENTS:
            r[j] = float(r[j])
    cross_validated_risk(rows)
    cells = [auc([r["risk_" + j] for r in rows if r[j]], [r["risk_" + j] for r in rows if not r[j]])
             for j in JUDGEMENTS]
    print(f"| all of them, cross-validated | {cells[0]:.2f} | {cells[1]:.2f} |")
    print("\n| dropped (riskiest first) | broken | a question with one | plausible | a question with one |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    ranked = sorted(rows, key=lambda r: -(r["risk_broken"] + r["risk_plausible"]))
    for drop in (0.0, 0.2, 0.4, 0.6):
        kept = ranked[int(drop * len(ranked)):]
        shares = [sum(r[j] for r in kept) / len(kept) for j in JUDGEMENTS]
        print(f"| {drop:.0%} | {shares[0]:.3f} | {1 - (1 - shares[0]) ** 3:.2f} "
              f"| {shares[1]:.3f} | {1 - (1 - shares[1]) ** 3:.2f} |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sheets", nargs="+", metavar="SHEET_PREFIX")
    parser.add_argument("--key-dir")
    parser.add_argument("--project", action="append", default=[], metavar="EXPORT_DIR=SQLITE")
    parser.add_argument("--scoring-input")
    parser.add_argument("--scores")
    args = parser.parse_args()
    given = {}
    for pair in args.project:
        export, _, path = pair.partition("=")
        given[os.path.normpath(export)] = path
    rows = [r for prefix in args.sheets for r in judged_endings(prefix, args.key_dir)]
    projects = {}
    for r in rows:
        path = project_of(os.path.normpath(r["export"]), given)
        if path not in projects:
            projects[path] = stored_signals(path)
        endings, gold, _ = projects[path]
        if (r["context"], r["text"]) not in endings:
            sys.exit(f"{r['sheet']}: the ending {r['text']!r} of {r['context']!r} is not in {path}")
        example, signals = endings[(r["context"], r["text"])]
        r.update(project=path, example=example, words=len(r["text"].split()))
        for name, value in signals.items():
            real = gold.get(example, {}).get(name)
            r[name] = None if value is None or real is None else value - real
    if args.scoring_input:
        write_scoring_input(rows, projects, args.scoring_input)
    if args.scores:
        add_scores(rows, args.scores)
    by_export = collections.defaultdict(list)
    for r in rows:
        by_export[r["export"]].append(r)
    for export, export_rows in sorted(by_export.items()):
        report(export, [dict(r) for r in export_rows])
    if len(by_export) > 1:
        report("every export together", [dict(r) for r in rows])


def write_scoring_input(rows, projects, out):
    """One item per (project, context): the real ending first, then the judged wrong ones."""
    items = {}
    for r in rows:
        key = f"{r['project']}#{r['example']}"
        item = items.setdefault(key, {"key": key, "context": r["context"],
                                      "options": [projects[r["project"]][2][r["example"]]]})
        if r["text"] not in item["options"]:
            item["options"].append(r["text"])
    with open(out, "w", encoding="utf-8") as f:
        json.dump(list(items.values()), f)
    print(f"wrote {len(items)} questions to {out}", file=sys.stderr)


def add_scores(rows, path):
    """The --scores model's signals, relative to the real ending (option 0): the mean token
    log-probability after the context and alone, and the worst token's (alone, the first token
    left out: with no context before it, any first word surprises)."""
    scored = {s["key"]: s for s in json.load(open(path, encoding="utf-8"))}
    for r in rows:
        s = scored.get(f"{r['project']}#{r['example']}")
        if s is None or r["text"] not in s["options"]:
            sys.exit(f"{path}: no score for {r['text']!r}; write the input again with "
                     f"--scoring-input and score it")
        i = s["options"].index(r["text"])
        signals = {
            "model_cond": [sum(t) / max(1, len(t)) for t in s["cond"]],
            "model_alone": [sum(t) / max(1, len(t)) for t in s["alone"]],
            "model_worst_cond": [min(t, default=0.0) for t in s["cond"]],
            "model_worst_alone": [min(t[1:], default=0.0) for t in s["alone"]],
        }
        for name, values in signals.items():
            r[name] = values[i] - values[0]


if __name__ == "__main__":
    main()
