#!/usr/bin/env python3
"""Style probe: how far a project's *generated* endings are from its found ones, before AF.

Every three generated endings of a pool become a four-way question with one found ending of
the project drawn from another video (each found ending is used once). The result is a
SWAG-format folder that `afkit audit DIR --cv 5` scores with 5 folds by the pool's video, so a
context's generated endings never straddle train and test. Read only the ending-only baselines
(`ngram_end`, `char_end`, `shortest`, `longest`): the found ending's context is not the pool's,
so the baselines that read the context measure that mismatch, not style. A score near 0.25
means these classifiers cannot tell the generator's writing from the corpus's; the random
control of a benchmark measures the same with one question per context, so this probe needs
far fewer contexts for the same precision.

    python3 scripts/style_probe.py PROJECT.sqlite OUT_DIR [--contexts N] [--seed 0]
    afkit audit OUT_DIR --cv 5

It also prints the register of the generated endings beside the found ones: words per ending,
commas per ending, the share of endings with a word that no (other) found ending of the project
uses, and the share that start with "'s".
"""
import argparse
import csv
import os
import random
import re
from collections import Counter
import sqlite3

HEADER = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
          "ending0", "ending1", "ending2", "ending3", "label"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("project")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--contexts", type=int, help="only the first N pools, by example id (to "
                    "compare two projects of the same examples on the same contexts)")
    args = ap.parse_args()
    con = sqlite3.connect(args.project)
    rng = random.Random(args.seed)
    found = con.execute("SELECT id, grp, sent1, sent2, ending FROM examples ORDER BY id").fetchall()
    rng.shuffle(found)
    pools = con.execute(
        "SELECT x.id, x.grp FROM examples x WHERE EXISTS (SELECT 1 FROM endings e "
        "WHERE e.example_id = x.id AND e.is_gold = 0) ORDER BY x.id").fetchall()
    pools = pools[:args.contexts]
    os.makedirs(args.out, exist_ok=True)
    questions = 0
    with open(os.path.join(args.out, "train.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEADER)
        for ex_id, group in pools:
            negatives = [t for (t,) in con.execute(
                "SELECT text FROM endings WHERE example_id = ? AND is_gold = 0 ORDER BY id",
                (ex_id,))]
            rng.shuffle(negatives)
            for q in range(len(negatives) // 3):
                pick = next((i for i, ex in enumerate(found) if ex[1] != group), None)
                if pick is None:
                    break
                gold_id, _, sent1, sent2, gold = found.pop(pick)
                endings = negatives[3 * q: 3 * q + 3]
                label = rng.randrange(4)
                endings.insert(label, gold)
                w.writerow([group, gold_id, f"{sent1} {sent2}", sent1, sent2, "probe",
                            *endings, label])
                questions += 1
    print(f"{questions} questions from {len(pools)} pools in {args.out}/train.csv")
    print_register(con, [ex_id for ex_id, _ in pools])


def words(text):
    return re.findall(r"[a-z]+", text.lower())


def print_register(con, pooled):
    found = [t for (t,) in con.execute("SELECT ending FROM examples")]
    counts = Counter(w for t in found for w in words(t))
    marks = ",".join("?" * len(pooled))
    generated = [t for (t,) in con.execute(
        f"SELECT text FROM endings WHERE is_gold = 0 AND example_id IN ({marks})", pooled)]
    print(f"{'endings':<10} {'count':>6} {'words':>6} {'commas':>7} {'new word':>9} {'starts s':>9}")
    def new_word(text, own):
        # A found ending's own words do not count: would the rest of the corpus know them?
        mine = Counter(words(text)) if own else Counter()
        return any(counts[w] - mine[w] == 0 for w in words(text))
    for name, texts in (("found", found), ("generated", generated)):
        n = max(len(texts), 1)
        print(f"{name:<10} {len(texts):>6} "
              f"{sum(len(t.split()) for t in texts) / n:>6.1f} "
              f"{sum(t.count(',') for t in texts) / n:>7.2f} "
              f"{sum(new_word(t, name == 'found') for t in texts) / n:>9.1%} "
              f"{sum(t.startswith(chr(39) + 's') for t in texts) / n:>9.1%}")


if __name__ == "__main__":
    main()
