#!/usr/bin/env python3
"""Agreement of two AFLite runs from their score files (`OUT.scores.jsonl`, one line per input
example: id, score, removed_round): overlap of the retained sets and Spearman rank correlation of
the predictability scores. Prints one JSON object.

Usage: aflite_compare.py A.scores.jsonl B.scores.jsonl
"""
import json
import sys

from scipy.stats import spearmanr


def load(path):
    rows = {}
    with open(path) as f:
        for line in f:
            r = json.loads(line)
            if r.get("warmup"):
                continue
            rows[str(r["id"])] = r
    return rows


a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), "the two runs cover different examples"
kept_a = {i for i, r in a.items() if r["removed_round"] is None}
kept_b = {i for i, r in b.items() if r["removed_round"] is None}
both = [i for i in a if a[i]["score"] is not None and b[i]["score"] is not None]
first_a = {i for i, r in a.items() if r["removed_round"] == 1}
first_b = {i for i, r in b.items() if r["removed_round"] == 1}
rho = spearmanr([a[i]["score"] for i in both], [b[i]["score"] for i in both]).statistic
print(json.dumps({
    "retained_a": len(kept_a),
    "retained_b": len(kept_b),
    "retained_overlap": len(kept_a & kept_b) / max(len(kept_a), 1),
    "retained_jaccard": len(kept_a & kept_b) / max(len(kept_a | kept_b), 1),
    "round1_removed_overlap": len(first_a & first_b) / max(len(first_a), 1),
    "same_removed_round": sum(a[i]["removed_round"] == b[i]["removed_round"] for i in a) / len(a),
    "scores_spearman": rho,
    "scored_in_both": len(both),
}))
