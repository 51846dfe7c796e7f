#!/usr/bin/env python3
"""Copy a SWAG-format export keeping only some of its questions, to audit a part of a benchmark
on its own.

Two ways to choose, either or both:

- `--like OTHER`: the questions whose context (sent1, sent2) is also in export OTHER. Auditing the
  unverified export cut to the contexts a verified export kept tells apart what verification
  changed in the distractors from what it changed by dropping contexts.
- `--gold-source REGEX`: the questions whose `gold-source` matches, e.g. `orig` for the
  questions settled in the first annotation round, `reannot` for those re-annotated.

    python3 scripts/export_subset.py EXPORT PART --like OTHER
    afkit audit PART --cv 5 --no-finetune

train.csv, val.csv and test.csv are cut, and each split's _full.csv beside them row for row when
the export has one; every other file is left out of the copy. A test.csv without labels is cut
the same way and stays unlabelled.
"""

import argparse
import csv
import os
import re
import sys

SPLITS = ("train", "val", "test")


def read(path):
    """The rows of one CSV file, header first; exits with the file and line on a ragged row."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    if not rows:
        sys.exit(f"{path}: empty, expected a SWAG regular-column header")
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            sys.exit(f"{path}:{line}: {len(row)} fields, the header has {len(rows[0])}")
    return rows


def column(rows, name, path):
    if name not in rows[0]:
        sys.exit(f"{path}: line 1 has no `{name}` column")
    return rows[0].index(name)


def contexts(folder):
    """The (sent1, sent2) of every question of an export."""
    found = set()
    for split in SPLITS:
        path = os.path.join(folder, f"{split}.csv")
        rows = read(path)
        s1, s2 = column(rows, "sent1", path), column(rows, "sent2", path)
        found.update((row[s1], row[s2]) for row in rows[1:])
    return found


def choose(source, like, gold_source):
    """The files of the part, as (name, rows) with the header first, read whole before any is
    written so that a bad file leaves nothing behind."""
    files = []
    for split in SPLITS:
        path = os.path.join(source, f"{split}.csv")
        rows = read(path)
        s1, s2 = column(rows, "sent1", path), column(rows, "sent2", path)
        gold = column(rows, "gold-source", path) if gold_source else None
        keep = [
            i
            for i in range(1, len(rows))
            if (like is None or (rows[i][s1], rows[i][s2]) in like)
            and (gold is None or gold_source.search(rows[i][gold]))
        ]
        tables = [(f"{split}.csv", rows)]
        full_path = os.path.join(source, f"{split}_full.csv")
        if os.path.exists(full_path):
            full = read(full_path)
            if len(full) != len(rows):
                sys.exit(f"{full_path}: {len(full) - 1} questions, {path} has {len(rows) - 1}")
            tables.append((f"{split}_full.csv", full))
        files += [(name, [data[0]] + [data[i] for i in keep]) for name, data in tables]
    return files


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="an `afkit export` folder")
    parser.add_argument("part", help="the folder to write (created; must not exist)")
    parser.add_argument("--like", help="keep the questions whose context is in this export")
    parser.add_argument("--gold-source", help="keep the questions whose gold-source matches")
    args = parser.parse_args()
    if args.like is None and args.gold_source is None:
        parser.error("choose the questions with --like, --gold-source or both")
    if os.path.exists(args.part):
        sys.exit(f"{args.part} exists: pick a new folder")
    like = contexts(args.like) if args.like else None
    pattern = re.compile(args.gold_source) if args.gold_source else None
    files = choose(args.export, like, pattern)
    os.makedirs(args.part)
    for name, rows in files:
        with open(os.path.join(args.part, name), "w", newline="") as f:
            csv.writer(f).writerows(rows)
    kept = sum(len(rows) - 1 for name, rows in files if not name.endswith("_full.csv"))
    print(f"wrote {kept} questions to {args.part}")


if __name__ == "__main__":
    main()
