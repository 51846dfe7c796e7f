#!/usr/bin/env python3
"""A blind reading sheet: N questions of an AF export and N of its control, mixed, key apart.

A careful reader answers the sheet without knowing which export a question comes from or which
ending is the real one, then `scripts/blind_score.py` turns their answers into three rows per
export: the reader's accuracy, the share of questions with a second plausible ending, and the
share with an ungrammatical or non-word wrong ending.

The two exports must come from the same project's pools (`export --negatives adversarial` and
`export --negatives random`), so they hold the same contexts. Each context is used once on the
sheet, either from the AF export or from the control, never both: the real ending would be the
one option the two copies share.

    python3 scripts/blind_sheet.py AF_DIR CONTROL_DIR OUT_PREFIX [--n 50] [--seed 1]

writes OUT_PREFIX.sheet.md (the questions), OUT_PREFIX.answers.csv (a form to fill in, one row
per question) and OUT_PREFIX.key.json (which export and which ending is real; keep it away from
the reader). Labelled questions are read from every split's CSV; a withheld test split is read
from the DIR-test-answers.csv that `afkit export` writes beside the folder.
"""
import argparse
import csv
import json
import os
import random
import sys

LETTERS = "ABCD"
SPLITS = ("train", "val", "test")


def labelled_questions(folder):
    """(sent1, sent2) -> question dict, for every question whose label is known."""
    folder = folder.rstrip("/")
    answers = f"{folder}-test-answers.csv"
    files = [os.path.join(folder, f"{s}.csv") for s in SPLITS]
    if os.path.exists(answers):
        files = files[:2] + [answers]
    questions = {}
    for path in files:
        if not os.path.exists(path):
            continue
        with open(path, newline="", encoding="utf-8") as f:
            for line, row in enumerate(csv.DictReader(f), start=2):
                label = row.get("label", "").strip()
                if label not in ("0", "1", "2", "3"):
                    continue
                if row.get("gold-source", "").startswith("gen"):
                    # a verified export's training example whose answer is a generation
                    # annotators ranked best: not a question about the real ending
                    continue
                try:
                    endings = [row[f"ending{i}"] for i in range(4)]
                    key = (row["sent1"], row["sent2"])
                except KeyError as missing:
                    sys.exit(f"{path}:{line}: no column {missing}: not a SWAG-format export")
                questions[key] = {
                    "sent1": row["sent1"],
                    "sent2": row["sent2"],
                    "endings": endings,
                    "label": int(label),
                    "file": path,
                    "line": line,
                }
    if not questions:
        sys.exit(f"{folder}: no labelled question (is it an afkit export?)")
    return questions


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("af", help="the AF export folder")
    parser.add_argument("control", help="the random-negative export of the same pools")
    parser.add_argument("out", help="prefix of the three files written")
    parser.add_argument("--n", type=int, default=50, help="questions from each export")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()

    af, control = labelled_questions(args.af), labelled_questions(args.control)
    shared = sorted(set(af) & set(control))
    if len(shared) < 2 * args.n:
        sys.exit(
            f"the two exports share {len(shared)} labelled contexts; {2 * args.n} are needed "
            f"for --n {args.n} (each context appears once): lower --n or export more contexts"
        )
    rng = random.Random(args.seed)
    chosen = rng.sample(shared, 2 * args.n)
    sources = ["af"] * args.n + ["control"] * args.n
    rng.shuffle(sources)

    sheet = [
        f"# Blind reading sheet ({2 * args.n} questions)\n",
        "For each question: pick the ending that really follows; list any *other* ending that "
        "could also follow plausibly; list any ending that is ungrammatical or holds a non-word. "
        "Fill in the answers file, one row per question (letters, e.g. `B` or `A C`, blank for "
        "none).\n",
    ]
    key = {"seed": args.seed, "af": args.af, "control": args.control, "questions": []}
    for number, (context, source) in enumerate(zip(chosen, sources), start=1):
        q = (af if source == "af" else control)[context]
        sheet.append(f"\n## {number}\n\n{q['sent1']} {q['sent2']} …\n")
        for letter, ending in zip(LETTERS, q["endings"]):
            sheet.append(f"- **{letter}** … {ending}")
        key["questions"].append(
            {"question": number, "source": source, "answer": LETTERS[q["label"]],
             "file": q["file"], "line": q["line"]}
        )

    with open(f"{args.out}.sheet.md", "w", encoding="utf-8") as f:
        f.write("\n".join(sheet) + "\n")
    with open(f"{args.out}.answers.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "pick", "also_plausible", "ungrammatical"])
        for number in range(1, 2 * args.n + 1):
            writer.writerow([number, "", "", ""])
    with open(f"{args.out}.key.json", "w", encoding="utf-8") as f:
        json.dump(key, f, indent=1)
    print(f"wrote {args.out}.sheet.md, {args.out}.answers.csv and {args.out}.key.json "
          f"({args.n} AF and {args.n} control questions, mixed)")


if __name__ == "__main__":
    main()
