#!/usr/bin/env python3
"""Writes a seeded subset of an ActivityNet Captions file, chosen by video.

The quality benchmark tunes on one half of the videos and reports on the other, so that no
default is chosen on the contexts it is judged on. A video's half is fixed by a hash of its id
(the same for every seed); within the half, videos come in a seeded order and are taken until
their consecutive sentence pairs (one context each, before ingest's filters) reach --pairs.
`--exclude OTHER.json` skips every video of an earlier subset, so that a new check runs on
contexts no earlier run has seen.

    activitynet_subset.py train.json --half dev --pairs 400 --seed 0 > dev.json
"""
import argparse
import hashlib
import json
import random
import sys


def half_of(video_id: str) -> str:
    digest = hashlib.sha256(video_id.encode()).digest()
    return "dev" if digest[0] % 2 == 0 else "test"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("captions", help="ActivityNet Captions JSON (video id -> sentences)")
    parser.add_argument("--half", choices=["dev", "test"], required=True)
    parser.add_argument("--pairs", type=int, required=True, help="sentence pairs to reach")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exclude", action="append", default=[], metavar="SUBSET",
                        help="a subset written earlier: its videos are left out (repeatable)")
    args = parser.parse_args()
    with open(args.captions, encoding="utf-8") as f:
        videos = json.load(f)
    excluded = set()
    for path in args.exclude:
        with open(path, encoding="utf-8") as f:
            excluded.update(json.load(f))
    ids = sorted(v for v in videos if half_of(v) == args.half and v not in excluded)
    random.Random(args.seed).shuffle(ids)
    subset, pairs = {}, 0
    for video_id in ids:
        if pairs >= args.pairs:
            break
        subset[video_id] = videos[video_id]
        pairs += max(len(videos[video_id]["sentences"]) - 1, 0)
    if pairs < args.pairs:
        sys.exit(f"{args.captions}: the {args.half} half has only {pairs} sentence pairs")
    json.dump(subset, sys.stdout)


if __name__ == "__main__":
    main()
