#!/usr/bin/env python3
"""Copy a SWAG-format export with every question's answer drawn at random: a benchmark of the
same size and the same endings in which nothing can tell the real ending.

Auditing many such copies shows how far each audit row strays from 0.25 by chance alone at that
size, and how often a verdict calls a row off chance where there is nothing to find. `afkit audit
--cv` makes copies like these itself (`--chance-copies`); this script makes them as datasets, so
that the whole audit, verdicts included, can be run on them.

    python3 scripts/relabel_export.py EXPORT COPY --seed 3
    afkit audit COPY --cv 5 --no-finetune --json

Only the `label` column of train.csv, val.csv and test.csv changes (a test.csv without labels
stays unlabelled); every other column and file is left out of the copy.
"""

import argparse
import csv
import os
import random
import sys

SPLITS = ("train.csv", "val.csv", "test.csv")
OPTIONS = 4


def relabel(source, target, rng):
    """Writes `source` to `target` with each non-empty label replaced by a random option."""
    with open(source, newline="") as f:
        rows = list(csv.reader(f))
    if not rows or "label" not in rows[0]:
        sys.exit(f"{source}: line 1 has no `label` column (expected a SWAG regular-column header)")
    column = rows[0].index("label")
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(rows[0]):
            sys.exit(f"{source}:{line}: {len(row)} fields, the header has {len(rows[0])}")
        if row[column] != "":
            row[column] = str(rng.randrange(OPTIONS))
    with open(target, "w", newline="") as f:
        csv.writer(f).writerows(rows)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("export", help="a directory with train.csv and val.csv (and test.csv)")
    parser.add_argument("copy", help="the directory to write (must not exist)")
    parser.add_argument("--seed", type=int, required=True, help="seed of the random answers")
    args = parser.parse_args()
    present = [s for s in SPLITS if os.path.exists(os.path.join(args.export, s))]
    if "train.csv" not in present:
        sys.exit(f"{args.export}: no train.csv")
    if os.path.exists(args.copy):
        sys.exit(f"{args.copy} exists: pick another directory")
    os.makedirs(args.copy)
    rng = random.Random(args.seed)
    for split in present:
        relabel(os.path.join(args.export, split), os.path.join(args.copy, split), rng)


if __name__ == "__main__":
    main()
