#!/usr/bin/env python3
"""Write the input files of a synthetic project of any size, for the big-project benchmark.

Writes two files that afkit's own commands read, so the benchmark times afkit's ingest and
import paths, not this script:
  OUT_DIR/examples.jsonl  {"id", "sent1", "sent2", "ending", "group"} per context (ingest)
  OUT_DIR/pools.jsonl     a scored pool per context (import-pool): N- endings, each with LM
                          features, plus the gold ending's and the context's features

Texts are real caption pairs, cycled: sent1 = a caption, sent2 = the first two words of the
next one, the gold ending = the rest. A context's N- candidates are distinct endings of other
captions, so lengths and vocabulary are realistic. Features are random draws; the gold ending's
conditional log-prob is shifted up a little, so that the MLP has a tell to filter away.

usage: scripts/synthetic_big_project.py CAPTIONS.json OUT_DIR --contexts 100000 --n-neg 256
CAPTIONS.json is ActivityNet-style ({video: {"sentences": [...]}}); data/sample/captions.json
works when nothing bigger is at hand.
"""

import argparse
import json
import os
import random


def caption_pairs(path):
    with open(path) as f:
        videos = json.load(f)
    pairs = []
    for video in sorted(videos):
        sentences = [s.strip() for s in videos[video]["sentences"]]
        for i in range(len(sentences) - 1):
            words = sentences[i + 1].split()
            # Inside ingest's length filters, so that every context is kept.
            if 6 <= len(words) <= 20 and len(sentences[i].split()) >= 6:
                pairs.append((sentences[i], " ".join(words[:2]), " ".join(words[2:])))
    return pairs


def feature(rng, mean):
    return round(rng.gauss(mean, 0.6), 4)


def ending_object(rng, text, lp_cond_mean):
    final = "null" if rng.random() < 0.05 else repr(feature(rng, -1.0))
    n_tok = max(1, int(len(text.split()) * 1.25 + rng.random() * 2))
    return (
        '{"text": %s, "lp_cond": %r, "lp_alone": %r, "lp_final_punct": %s, "n_tok": %d}'
        % (json.dumps(text), feature(rng, lp_cond_mean), feature(rng, -3.5), final, n_tok)
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("captions")
    ap.add_argument("out_dir")
    ap.add_argument("--contexts", type=int, default=100_000)
    ap.add_argument("--n-neg", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pairs = caption_pairs(args.captions)
    endings = sorted({p[2] for p in pairs})
    if len(endings) <= args.n_neg:
        raise SystemExit(f"{args.captions}: {len(endings)} distinct endings, need more than N- = {args.n_neg}")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "examples.jsonl"), "w") as examples, open(
        os.path.join(args.out_dir, "pools.jsonl"), "w"
    ) as pools:
        for i in range(args.contexts):
            sent1, sent2, gold = pairs[i % len(pairs)]
            ext_id = f"syn{i}"
            examples.write(
                json.dumps({"id": ext_id, "sent1": sent1, "sent2": sent2, "ending": gold, "group": f"g{i // 5}"})
                + "\n"
            )
            candidates = [e for e in rng.sample(endings, args.n_neg + 1) if e != gold][: args.n_neg]
            gold_features = json.loads(ending_object(rng, gold, -2.2))
            del gold_features["text"]
            pools.write(
                '{"id": %s, "endings": [%s], "gold": %s, "context": %s}\n'
                % (
                    json.dumps(ext_id),
                    ", ".join(ending_object(rng, e, -2.5) for e in candidates),
                    json.dumps(gold_features),
                    json.dumps(
                        {
                            "ctx_logprob": feature(rng, -3.0),
                            "n_tok_sent1": int(len(sent1.split()) * 1.25),
                            "n_tok_sent2": int(len(sent2.split()) * 1.25),
                        }
                    ),
                )
            )


if __name__ == "__main__":
    main()
