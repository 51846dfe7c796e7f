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

It also prints the register of the generated endings beside the found ones: words per ending,
commas per ending, the share of endings with a word that no found ending of the project uses,
and the share that start with "'s".
"""
import argparse
import csv
import os
import random
import re
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
    print_register(con, [ex_id for ex_id, *_ in examples])


def words(text):
    return re.findall(r"[a-z]+", text.lower())


def print_register(con, pooled):
    found = [t for (t,) in con.execute("SELECT ending FROM examples")]
    vocabulary = {w for t in found for w in words(t)}
    marks = ",".join("?" * len(pooled))
    generated = [t for (t,) in con.execute(
        f"SELECT text FROM endings WHERE is_gold = 0 AND example_id IN ({marks})", pooled)]
    print(f"{'endings':<10} {'count':>6} {'words':>6} {'commas':>7} {'new word':>9} {'starts s':>9}")
    for name, texts in (("found", found), ("generated", generated)):
        n = max(len(texts), 1)
        print(f"{name:<10} {len(texts):>6} "
              f"{sum(len(t.split()) for t in texts) / n:>6.1f} "
              f"{sum(t.count(',') for t in texts) / n:>7.2f} "
              f"{sum(any(w not in vocabulary for w in words(t)) for t in texts) / n:>9.1%} "
              f"{sum(t.startswith(chr(39) + 's') for t in texts) / n:>9.1%}")


if __name__ == "__main__":
    main()
