#!/usr/bin/env python3
"""Style probe: how far a project's *generated* endings are from its found ones, before AF.

Every pool becomes several four-way questions: the found ending and three of the pool's
generated endings, drawn without replacement (a pool of 32 gives up to 10 questions). The result
is a SWAG-format folder that `afkit audit DIR --cv 5` scores with 5 folds by video, so questions
of one context never straddle train and test. A score near 0.25 means the stylistic classifiers
cannot tell the generator's writing from the corpus's; the random-negative control of a
benchmark measures the same thing with one question per context, so this probe needs far fewer
contexts for the same precision.

    python3 scripts/style_probe.py PROJECT.sqlite OUT_DIR [--per-context 8] [--seed 0]
    afkit audit OUT_DIR --cv 5
"""
import argparse
import csv
import os
import random
import sqlite3

HEADER = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("project")
    ap.add_argument("out")
    ap.add_argument("--per-context", type=int, default=8, help="questions per context at most")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    con = sqlite3.connect(args.project)
    rng = random.Random(args.seed)
    examples = con.execute(
        "SELECT x.id, x.grp, x.sent1, x.sent2, x.ending FROM examples x "
        "WHERE EXISTS (SELECT 1 FROM endings e WHERE e.example_id = x.id AND e.is_gold = 0) "
        "ORDER BY x.id").fetchall()
    os.makedirs(args.out, exist_ok=True)
    questions = 0
    with open(os.path.join(args.out, "train.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for ex_id, group, sent1, sent2, gold in examples:
            negatives = [t for (t,) in con.execute(
                "SELECT text FROM endings WHERE example_id = ? AND is_gold = 0 ORDER BY id",
                (ex_id,))]
            rng.shuffle(negatives)
            for q in range(min(args.per_context, len(negatives) // 3)):
                endings = negatives[3 * q: 3 * q + 3]
                label = rng.randrange(4)
                endings.insert(label, gold)
                w.writerow([group, ex_id, f"{sent1} {sent2}", sent1, sent2, "probe",
                            *endings, label])
                questions += 1
    print(f"{questions} questions from {len(examples)} contexts in {args.out}/train.csv")


if __name__ == "__main__":
    main()
