#!/usr/bin/env python3
"""Scores a blind reading (`scripts/blind_sheet.py`) into four rows per export.

    python3 scripts/blind_score.py OUT_PREFIX.key.json ANSWERS.csv [--json]

ANSWERS.csv has one row per question: `question,pick,also_plausible,ungrammatical`, where `pick`
is the ending the reader chose (A-D), `also_plausible` the other endings they found could also
follow, and `ungrammatical` the endings they found ungrammatical or holding a non-word (letters
separated by spaces or commas, blank for none). For each export it prints:

- reader's accuracy: the pick is the real ending;
- a second plausible ending: some ending other than the real one was picked or marked plausible;
- an ungrammatical or non-word wrong ending: some ending other than the real one was marked so;
- a question to drop: any of the three (a wrong pick, a second plausible ending or a broken wrong
  ending), the share a validated subset would lose;

each as a count, a share and a 95% Wilson interval. A row that names a question twice, a letter
outside A-D or a question the key lacks is an error with its line; a question left without a
pick is reported and counted as unanswered.
"""
import argparse
import csv
import json
import math
import os
import sys

LETTERS = "ABCD"


def letters(text, path, line, column):
    found = set(text.replace(",", " ").upper().split())
    bad = found - set(LETTERS)
    if bad:
        sys.exit(f"{path}:{line}: {column} holds {' '.join(sorted(bad))}: expected letters A-D")
    return found


def wilson(k, n, z=1.959963984540054):
    if n == 0:
        return (float("nan"), float("nan"))
    p = k / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def read_answers(path, numbers):
    answers = {}
    with open(path, newline="", encoding="utf-8") as f:
        for line, row in enumerate(csv.DictReader(f), start=2):
            try:
                number = int(row["question"])
            except (KeyError, TypeError, ValueError):
                sys.exit(f"{path}:{line}: expected a question number in column `question`")
            if number not in numbers:
                sys.exit(f"{path}:{line}: question {number} is not on the sheet")
            if number in answers:
                sys.exit(f"{path}:{line}: question {number} answered twice")
            pick = letters(row.get("pick") or "", path, line, "pick")
            if len(pick) > 1:
                sys.exit(f"{path}:{line}: pick holds several letters: expected one")
            answers[number] = {
                "pick": next(iter(pick), None),
                "plausible": letters(row.get("also_plausible") or "", path, line, "also_plausible"),
                "ungrammatical": letters(row.get("ungrammatical") or "", path, line, "ungrammatical"),
            }
    return answers


def score(key, answers):
    rows = {}
    for source in ("af", "control"):
        counts = {"questions": 0, "answered": 0, "correct": 0, "second": 0, "ungrammatical": 0,
                  "drop": 0}
        for q in key["questions"]:
            if q["source"] != source:
                continue
            counts["questions"] += 1
            a = answers.get(q["question"])
            if a is None or a["pick"] is None:
                continue
            real = q["answer"]
            counts["answered"] += 1
            counts["correct"] += a["pick"] == real
            others = (a["plausible"] | {a["pick"]}) - {real}
            broken = a["ungrammatical"] - {real}
            counts["second"] += bool(others)
            counts["ungrammatical"] += bool(broken)
            counts["drop"] += a["pick"] != real or bool(others) or bool(broken)
        rows[source] = counts
    return rows


def cell(k, n):
    if n == 0:
        return "–"
    low, high = wilson(k, n)
    return f"{k}/{n} ({100 * k / n:.0f}%, {100 * low:.0f}–{100 * high:.0f}%)"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("key")
    parser.add_argument("answers")
    parser.add_argument("--json", action="store_true", help="print the counts as JSON")
    args = parser.parse_args()
    with open(args.key, encoding="utf-8") as f:
        key = json.load(f)
    answers = read_answers(args.answers, {q["question"] for q in key["questions"]})
    rows = score(key, answers)
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    af, control = rows["af"], rows["control"]
    # the sheet's two exports by folder name: the second is not always a random control
    names = [os.path.basename(str(key[s]).rstrip("/")) or s for s in ("af", "control")]
    print(f"| | {names[0]} (first export) | {names[1]} (second export) |")
    print("| --- | ---: | ---: |")
    for name, field in (
        ("reader's accuracy", "correct"),
        ("a second plausible ending", "second"),
        ("an ungrammatical or non-word wrong ending", "ungrammatical"),
        ("a question to drop (any of the three)", "drop"),
    ):
        print(f"| {name} | {cell(af[field], af['answered'])} | "
              f"{cell(control[field], control['answered'])} |")
    for source, counts in rows.items():
        missing = counts["questions"] - counts["answered"]
        if missing:
            print(f"\n{source}: {missing} of {counts['questions']} questions have no pick "
                  "and are left out")


if __name__ == "__main__":
    main()
