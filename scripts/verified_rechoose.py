#!/usr/bin/env python3
"""An experiment on verified exports: among the endings annotators judged unlikely, choose the
three that a style classifier finds likeliest to be real, and write the export with them.

Verified assembly keeps a generated ending as a distractor only when annotators judged it
unlikely, and AF's scores, made before anyone labelled, do not see what sets those endings apart
from the real ones. This asks how much of that a choice made after annotation recovers: a
character 2-4-gram naive Bayes, cross-fitted in five folds by group (video), is trained on the
found endings against the unlikely-judged ones of the other folds, and each question of the held-
out fold gets the three unlikely-judged endings it scores likeliest to be real (where it has at
least three). Questions whose answer is a generation (gold-source gen-orig) stay as they are.

    python3 scripts/verified_rechoose.py PROJECT.sqlite VERIFIED_EXPORT OUT
    afkit audit OUT --cv 5 --no-finetune

An ending counts as judged unlikely when more than half of its labels (over every round) say so.
Only train.csv, val.csv and test.csv are written; the label column keeps its place.
"""

import collections
import csv
import math
import os
import sqlite3
import sys
import zlib

from export_subset import SPLITS, column, read

FOLDS = 5

UNLIKELY = """
with votes as (
    select t.example_id as example, l.ending_id as ending,
           sum(l.judgement = 'unlikely') as unlikely, count(*) as labels
    from labels l join submissions s on s.id = l.submission_id join tasks t on t.id = s.task_id
    where s.broken = 0 group by example, ending)
select votes.example, e.text from votes join endings e on e.id = votes.ending
where votes.unlikely * 2 > votes.labels and e.is_gold = 0
"""


def grams(text):
    padded = f" {text.lower()} "
    return [padded[i : i + n] for n in (2, 3, 4) for i in range(len(padded) - n + 1)]


def scorer(real, fake):
    """Mean log-likelihood ratio per n-gram of a text being real, add-one smoothed."""
    total_real, total_fake = sum(real.values()), sum(fake.values())
    vocabulary = len(set(real) | set(fake))

    def score(text):
        found = grams(text)
        ratio = sum(
            math.log((real[g] + 1) / (total_real + vocabulary))
            - math.log((fake[g] + 1) / (total_fake + vocabulary))
            for g in found
        )
        return ratio / max(1, len(found))

    return score


def choices(project):
    """example id -> the three unlikely-judged endings likeliest real, cross-fitted by group;
    and (sent1, sent2) -> example id."""
    con = sqlite3.connect(f"file:{project}?mode=ro", uri=True)
    unlikely = collections.defaultdict(list)
    for example, text in con.execute(UNLIKELY):
        unlikely[example].append(text)
    examples = con.execute("select id, sent1, sent2, ending, grp from examples").fetchall()
    ids = {(s1, s2): example for example, s1, s2, _, _ in examples}
    items = [
        (zlib.crc32(grp.encode()) % FOLDS, found, unlikely[example], example)
        for example, _, _, found, grp in examples
        if example in unlikely
    ]
    chosen = {}
    for fold in range(FOLDS):
        real, fake = collections.Counter(), collections.Counter()
        for other, found, judged, _ in items:
            if other != fold:
                real.update(grams(found))
                for text in judged:
                    fake.update(grams(text))
        score = scorer(real, fake)
        for other, _, judged, example in items:
            if other == fold and len(judged) >= 3:
                chosen[example] = sorted(judged, key=score, reverse=True)[:3]
    return chosen, ids


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    project, source, target = sys.argv[1:]
    if os.path.exists(target):
        sys.exit(f"{target} exists: pick a new folder")
    chosen, ids = choices(project)
    tables, changed = [], 0
    for split in SPLITS:
        path = os.path.join(source, f"{split}.csv")
        rows = read(path)
        names = ("sent1", "sent2", "label", "gold-source")
        s1, s2, label, gold = (column(rows, name, path) for name in names)
        endings = [column(rows, f"ending{i}", path) for i in range(4)]
        for row in rows[1:]:
            example = ids.get((row[s1], row[s2]))
            if row[gold] == "gen-orig" or example not in chosen:
                continue
            slots = [e for i, e in enumerate(endings) if i != int(row[label])]
            changed += sorted(row[e] for e in slots) != sorted(chosen[example])
            for slot, text in zip(slots, chosen[example]):
                row[slot] = text
        tables.append((split, rows))
    os.makedirs(target)
    for split, rows in tables:
        with open(os.path.join(target, f"{split}.csv"), "w", newline="") as f:
            csv.writer(f).writerows(rows)
    print(f"wrote {target}: {changed} questions with other distractors")


if __name__ == "__main__":
    main()
