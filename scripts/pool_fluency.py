#!/usr/bin/env python3
"""How a project's candidate endings sit against its found endings, before any filtering.

    python3 scripts/pool_fluency.py PROJECT.sqlite [PROJECT.sqlite ...] [--contexts N]
                                    [--captions ../shared/data/activitynet-captions/train.json]

For each project, over the contexts that have a pool (the first N by example id with
--contexts, so that projects sampled with different settings are compared on the same contexts):

- candidates: the number of candidate endings;
- lp candidates / lp found: the mean per-token log-probability of an ending after its context
  under the generating model (`lp_cond`, stored by `afkit generate`), over the candidates and
  over the found endings;
- below found: the share of candidates less likely than their context's found ending. Sampling
  that matches the found endings' register puts about half below; truncated sampling (`--min-p`,
  `--top-p`, a temperature under 1) puts fewer, and that gap is a style artifact AF then has to
  hide;
- outside the vocabulary: the share of candidates holding a word that appears fewer than twice in
  the captions file (a rough count of non-words and misspellings; rare real words count too).

Read-only: the projects may be in use.
"""
import argparse
import collections
import json
import re
import sqlite3
import statistics
import sys

WORD = re.compile(r"[a-z]+")


def vocabulary(captions):
    counts = collections.Counter()
    with open(captions, encoding="utf-8") as f:
        for video in json.load(f).values():
            for sentence in video["sentences"]:
                counts.update(WORD.findall(sentence.lower()))
    return {w for w, c in counts.items() if c >= 2}


def pool_figures(path, contexts, vocab):
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ids = [r[0] for r in db.execute("SELECT example_id FROM pools ORDER BY example_id")]
    if contexts:
        ids = ids[:contexts]
    if not ids:
        sys.exit(f"{path}: no pools")
    marks = ",".join("?" * len(ids))
    found = dict(db.execute(
        f"SELECT example_id, lp_cond FROM endings WHERE is_gold = 1 AND example_id IN ({marks})",
        ids))
    candidates = db.execute(
        f"SELECT example_id, text, lp_cond FROM endings"
        f" WHERE is_gold = 0 AND lp_cond IS NOT NULL AND example_id IN ({marks})", ids).fetchall()
    scored = [(e, t, lp) for e, t, lp in candidates if found.get(e) is not None]
    if not scored:
        sys.exit(f"{path}: no candidate with a stored log-probability")
    outside = sum(1 for _, t, _ in scored if any(w not in vocab for w in WORD.findall(t.lower())))
    return {
        "contexts": len(ids),
        "candidates": len(scored),
        "lp_candidates": statistics.mean(lp for _, _, lp in scored),
        "lp_found": statistics.mean(found[e] for e in ids if found.get(e) is not None),
        "below_found": sum(1 for e, _, lp in scored if lp < found[e]) / len(scored),
        "outside_vocabulary": outside / len(scored),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+")
    parser.add_argument("--contexts", type=int, default=0)
    parser.add_argument("--captions", default="../shared/data/activitynet-captions/train.json")
    args = parser.parse_args()
    vocab = vocabulary(args.captions)
    print("| project | contexts | candidates | lp candidates | lp found | below found "
          "| outside the vocabulary |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for path in args.projects:
        f = pool_figures(path, args.contexts, vocab)
        print(f"| {path} | {f['contexts']} | {f['candidates']} | {f['lp_candidates']:.2f} "
              f"| {f['lp_found']:.2f} | {f['below_found']:.0%} | {f['outside_vocabulary']:.0%} |")


if __name__ == "__main__":
    main()
