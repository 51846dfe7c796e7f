#!/usr/bin/env python3
"""Blind readings of two exports compared question by question, to separate the readers from the
exports.

    python3 scripts/blind_paired.py --a PREFIX[:ANSWERS] ... --b PREFIX[:ANSWERS] ...

Each reading is a sheet of `scripts/blind_sheet.py` (PREFIX.sheet.md, PREFIX.key.json) and the
reader's answers (PREFIX.answers.csv unless given). For every pair of readings, one of group A and
one of group B, it finds the AF questions both sheets show (the same context and real ending) and
counts, separately for the questions whose four endings are the same on both sheets and those
whose wrong answers differ, how often each side's reader found a second plausible ending (a wrong
answer picked or marked also plausible). Readers of the same unchanged questions should agree on
average; where they do not, a difference between the two exports' overall figures is the readers'.
"""
import argparse
import csv
import json
import re


def sheet_questions(path):
    """Question number -> (context line, {letter: ending}) from a sheet."""
    questions, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            heading = re.match(r"^## (\d+)$", line)
            if heading:
                current = int(heading.group(1))
                questions[current] = [None, {}]
                continue
            option = re.match(r"^- \*\*([ABCD])\*\* … (.*)$", line)
            if current is None:
                continue
            if option:
                questions[current][1][option.group(1)] = option.group(2)
            elif line.strip() and questions[current][0] is None:
                questions[current][0] = line.strip()
    return questions


def af_questions(spec):
    """The AF questions of a reading PREFIX[:ANSWERS]: for each, (context, real ending, its wrong
    answers as {letter: text}, the letters of those the reader picked or marked also plausible)."""
    prefix, _, answers = spec.partition(":")
    answers = answers or f"{prefix}.answers.csv"
    key = json.load(open(f"{prefix}.key.json", encoding="utf-8"))
    sheet = sheet_questions(f"{prefix}.sheet.md")
    with open(answers, newline="", encoding="utf-8") as f:
        rows = {int(r["question"]): r for r in csv.DictReader(f)}
    for q in key["questions"]:
        if q["source"] != "af":
            continue
        context, options = sheet[q["question"]]
        row = rows[q["question"]]
        named = set(row["also_plausible"].replace(",", " ").upper().split())
        named |= {row["pick"].strip().upper()}
        wrong = {letter: t for letter, t in options.items() if letter != q["answer"]}
        yield context, options[q["answer"]], wrong, named & wrong.keys()


def reading(spec):
    """(context, real ending) -> (frozenset of wrong answers, whether the reader saw a second one)."""
    return {
        (context, real): (frozenset(wrong.values()), bool(named))
        for context, real, wrong, named in af_questions(spec)
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--a", nargs="+", required=True, help="readings of the first export")
    parser.add_argument("--b", nargs="+", required=True, help="readings of the second export")
    args = parser.parse_args()
    group_a = [reading(s) for s in args.a]
    group_b = [reading(s) for s in args.b]
    counts = {"same": [0, 0, 0], "changed": [0, 0, 0]}
    for a in group_a:
        for b in group_b:
            for question in a.keys() & b.keys():
                kind = "same" if a[question][0] == b[question][0] else "changed"
                counts[kind][0] += 1
                counts[kind][1] += a[question][1]
                counts[kind][2] += b[question][1]
    for kind, label in (("same", "the same four endings"), ("changed", "other wrong answers")):
        pairs, in_a, in_b = counts[kind]
        print(f"{label}: {pairs} pairs of readings of one question; a second plausible ending "
              f"found by A's reader {in_a}, by B's reader {in_b}")


if __name__ == "__main__":
    main()
