#!/usr/bin/env python3
"""Build a synthetic AF benchmark project: real ActivityNet caption pairs, fake pools.

Used to time `afkit filter` at sizes the cached SmolLM2 pool does not have (contexts x 2,
N- x 2). Each context is a consecutive caption pair: sent1 = the first sentence, sent2 = the
first two words of the second, the gold ending = the rest. Its N- "generated" endings are the
endings of other, random contexts (so lengths and vocabulary are realistic), and every LM feature
is drawn from one normal distribution for gold and candidates alike (no LM signal).

usage: afkit init OUT.sqlite && scripts/synthetic_af_pool.py ACTIVITYNET.json OUT.sqlite \
           --contexts 1000 --n-neg 32 [--seed 0]
"""

import argparse
import json
import random
import sqlite3

NOW = "2026-01-01T00:00:00.000Z"


def pairs(path):
    with open(path) as f:
        videos = json.load(f)
    for video_id in sorted(videos):
        sentences = [s.strip() for s in videos[video_id]["sentences"]]
        for i in range(len(sentences) - 1):
            words = sentences[i + 1].split()
            if len(words) < 5 or not sentences[i]:
                continue
            yield video_id, i, sentences[i], " ".join(words[:2]), " ".join(words[2:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("activitynet")
    ap.add_argument("project")
    ap.add_argument("--contexts", type=int, default=1000)
    ap.add_argument("--n-neg", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    all_pairs = list(pairs(args.activitynet))
    rng.shuffle(all_pairs)
    chosen = all_pairs[: args.contexts]
    others = [p[4] for p in all_pairs[args.contexts :]]

    db = sqlite3.connect(args.project)
    with db:
        db.execute(
            "INSERT INTO sources(path, format, sha256, options, ingested_at) VALUES (?, 'jsonl', ?, '{}', ?)",
            (args.activitynet, f"synthetic-{args.seed}-{args.contexts}-{args.n_neg}", NOW),
        )
        source = db.execute("SELECT MAX(id) FROM sources").fetchone()[0]
        db.execute(
            "INSERT INTO generations(backend, model, prompt, params, seed, started_at) "
            "VALUES ('import', 'synthetic: endings of other contexts', 'none', '{}', ?, ?)",
            (args.seed, NOW),
        )
        generation = db.execute("SELECT MAX(id) FROM generations").fetchone()[0]

        def features(text):
            return (rng.gauss(-3, 1), rng.gauss(-4, 1), rng.gauss(-1, 0.5), len(text.split()) + 2)

        for video_id, i, sent1, sent2, ending in chosen:
            cur = db.execute(
                "INSERT INTO examples(ext_id, grp, sent1, sent2, ending, source_id, added_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (f"{video_id}#{i}", video_id, sent1, sent2, ending, source, NOW),
            )
            example = cur.lastrowid
            db.execute(
                "INSERT INTO endings(example_id, text, is_gold, lp_cond, lp_alone, lp_final_punct, "
                "n_tok_ending) VALUES (?, ?, 1, ?, ?, ?, ?)",
                (example, ending, *features(ending)),
            )
            texts = {ending}
            while len(texts) < args.n_neg + 1:
                text = rng.choice(others)
                if text in texts:
                    continue
                texts.add(text)
                db.execute(
                    "INSERT INTO endings(example_id, text, is_gold, generation_id, lp_cond, lp_alone, "
                    "lp_final_punct, n_tok_ending) VALUES (?, ?, 0, ?, ?, ?, ?, ?)",
                    (example, text, generation, *features(text)),
                )
            db.execute(
                "INSERT INTO pools(example_id, generation_id, requested, produced, ctx_logprob, "
                "n_tok_sent1, n_tok_sent2, seconds, finished_at) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?)",
                (example, generation, args.n_neg, args.n_neg, rng.gauss(-2.5, 0.5),
                 len(sent1.split()) + 2, len(sent2.split()) + 1, NOW),
            )
    print(f"{args.project}: {len(chosen)} contexts x {args.n_neg} endings")


if __name__ == "__main__":
    main()
