#!/usr/bin/env python3
"""What the annotators said of the wrong answers a blind reader found plausible.

    python3 scripts/blind_votes.py PROJECT PREFIX[:ANSWERS] ...

For each reading (a sheet of `scripts/blind_sheet.py`, PREFIX.sheet.md and PREFIX.key.json, and
the reader's answers, PREFIX.answers.csv unless given) of an export of PROJECT, it looks up every
wrong answer of the AF questions in the project's annotation labels and counts the wrong answers
by whether the reader found them plausible (picked or marked also plausible), by how many
annotators labelled them (1, 2, 3 or more) and by whether any of those called them likely. A rule
that lets one "likely" keep an ending out can only remove what the last column counts.
"""
import argparse
import collections
import sqlite3
import sys
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from blind_paired import af_questions  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("project")
    parser.add_argument("readings", nargs="+")
    args = parser.parse_args()
    db = sqlite3.connect(f"file:{args.project}?mode=ro", uri=True)
    table = collections.Counter()
    for spec in args.readings:
        for _, _, wrong, named in af_questions(spec):
            for letter, text in wrong.items():
                votes = db.execute(
                    "SELECT l.judgement FROM labels l JOIN endings e ON e.id = l.ending_id "
                    "WHERE e.text = ?",
                    (text,),
                ).fetchall()
                n = min(len(votes), 3)
                likely = any(v[0] == "likely" for v in votes)
                table[(letter in named, n, likely)] += 1
    print("| found plausible by the reader | annotators' votes | any 'likely' | wrong answers |")
    print("| --- | ---: | --- | ---: |")
    for (flagged, n, likely), count in sorted(table.items()):
        votes = "3 or more" if n == 3 else str(n)
        print(f"| {'yes' if flagged else 'no'} | {votes} | {'yes' if likely else 'no'} | {count} |")


if __name__ == "__main__":
    main()
