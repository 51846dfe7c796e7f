#!/usr/bin/env python3
"""AFLite (Le Bras et al., Algorithm 1, greedy slicing) with scikit-learn, as a peer for afkit.

Same objective as `afkit aflite`: LogisticRegression(C, lbfgs, intercept, tol, max_iter) per
partition, predictability p = correct / predicted, remove up to min(k, |S| - n) examples with the
highest p >= tau (ties broken by afkit's tie-break ranks), stop when fewer than k passed tau.

With --partitions FILE (written by `afkit aflite --dump-partitions FILE`) every round trains on
afkit's training sets; if this run's S has drifted from afkit's, training rows that this run
already removed are dropped from the set (counted in the report). Without the file, partitions
are drawn with numpy from --seed.

Thread settings are the caller's: set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS / MKL_NUM_THREADS
before starting Python (they are recorded in the report).

Usage:
  aflite_peer.py --input DATA.jsonl --features X.npy --out-scores PEER.scores.jsonl \
      --target-size 6000 --train-size 5000 --slice 500 [--partitions-file P.jsonl] [--m 64]
"""

import argparse
import json
import os
import time

import numpy as np
from joblib import Parallel, delayed
from sklearn.linear_model import LogisticRegression


def read_labels(path):
    ids, labels = [], []
    with open(path) as f:
        for n, line in enumerate(f):
            if not line.strip():
                continue
            record = json.loads(line)
            ids.append(str(record.get("id", n + 1)))
            label = record["label"]
            labels.append(json.dumps(label) if not isinstance(label, str) else label)
    names = sorted(set(labels))
    return ids, np.array([names.index(l) for l in labels]), names


def fit_predict(X, y, in_s, train, args):
    """One partition: fit on the training rows, predict the rest of S."""
    test_mask = in_s.copy()
    test_mask[train] = False
    test = np.flatnonzero(test_mask)
    model = LogisticRegression(C=args.c, tol=args.tol, max_iter=args.max_iter)
    model.fit(X[train], y[train])
    return test, model.predict(X[test]) == y[test], model.n_iter_.max() < args.max_iter


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--input", required=True)
    ap.add_argument("--features", required=True)
    ap.add_argument("--out-scores", required=True)
    ap.add_argument("--report", help="write timing and settings as JSON here")
    ap.add_argument("--partitions-file")
    ap.add_argument("--target-size", type=int, required=True)
    ap.add_argument("--train-size", type=int, required=True)
    ap.add_argument("--slice", type=int, required=True)
    ap.add_argument("--m", type=int, default=64)
    ap.add_argument("--tau", type=float, default=0.75)
    ap.add_argument("--c", type=float, default=1.0)
    ap.add_argument("--tol", type=float, default=1e-4)
    ap.add_argument("--max-iter", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes fitting partitions in parallel (joblib)")
    ap.add_argument("--max-rounds", type=int, help="stop after this many rounds (for timing only)")
    args = ap.parse_args()

    wall_start = time.perf_counter()
    ids, y, _ = read_labels(args.input)
    # Memory-mapped, so worker processes receive it by reference, not by copy.
    X = np.load(args.features, mmap_mode="r")
    assert X.shape[0] == len(y), "one feature row per example"
    n_total = len(y)

    partitions = open(args.partitions_file) if args.partitions_file else None
    if partitions:
        header = json.loads(partitions.readline())
        tiebreak = np.array([r if r is not None else n_total for r in header["tiebreak_rank"]])
    else:
        tiebreak = np.random.default_rng(args.seed).permutation(n_total)
    rng = np.random.default_rng(args.seed)
    pool = Parallel(n_jobs=args.jobs)

    in_s = np.ones(n_total, dtype=bool)
    score = np.full(n_total, np.nan)
    removed_round = [None] * n_total
    rounds = []
    dropped_train_rows = 0
    own_partition_rounds = 0
    parse_seconds = 0.0
    fit_seconds = 0.0
    not_converged = 0
    loop_start = time.perf_counter()
    round_no = 0
    while in_s.sum() > args.target_size:
        round_no += 1
        s = np.flatnonzero(in_s)
        t0 = time.perf_counter()
        line = partitions.readline() if partitions else ""
        if line:
            dumped = json.loads(line)
            train_sets = []
            for train in dumped["train"]:
                train = np.array(train)
                kept = train[in_s[train]]
                dropped_train_rows += len(train) - len(kept)
                train_sets.append(kept)
        else:
            if partitions:
                own_partition_rounds += 1
            train_sets = [np.sort(rng.choice(s, args.train_size, replace=False)) for _ in range(args.m)]
        parse_seconds += time.perf_counter() - t0

        t0 = time.perf_counter()
        correct = np.zeros(n_total)
        predicted = np.zeros(n_total)
        results = pool(delayed(fit_predict)(X, y, in_s, train, args) for train in train_sets)
        for test, right, converged in results:
            correct[test] += right
            predicted[test] += 1
            not_converged += not converged
        fit_seconds += time.perf_counter() - t0

        scored = s[predicted[s] > 0]
        p = correct[scored] / predicted[scored]
        score[scored] = p
        passed = scored[p >= args.tau]
        limit = min(args.slice, len(s) - args.target_size)
        order = np.lexsort((tiebreak[passed], -score[passed]))
        chosen = passed[order[:limit]]
        in_s[chosen] = False
        for i in chosen:
            removed_round[i] = round_no
        rounds.append({"round": round_no, "size": int(len(s)), "passed_tau": int(len(passed)),
                       "removed": int(len(chosen)), "mean_score": float(p.mean())})
        print(f"peer round {round_no}: |S| = {len(s)}, passed {len(passed)}, removed {len(chosen)}", flush=True)
        if len(passed) < args.slice or (args.max_rounds and round_no >= args.max_rounds):
            break
    loop_seconds = time.perf_counter() - loop_start

    with open(args.out_scores, "w") as f:
        for i in range(n_total):
            f.write(json.dumps({"id": ids[i], "score": None if np.isnan(score[i]) else float(score[i]),
                                "removed_round": removed_round[i]}) + "\n")
    report = {
        "rounds": rounds,
        "retained": int(in_s.sum()),
        "loop_seconds": loop_seconds,
        "fit_predict_seconds": fit_seconds,
        "partition_parse_seconds": parse_seconds,
        "wall_seconds": time.perf_counter() - wall_start,
        "dropped_train_rows": dropped_train_rows,
        "own_partition_rounds": own_partition_rounds,
        "fits_not_converged": not_converged,
        "jobs": args.jobs,
        "threads": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")},
    }
    if args.report:
        with open(args.report, "w") as f:
            json.dump(report, f, indent=2)
    print(json.dumps({k: v for k, v in report.items() if k != "rounds"}))


if __name__ == "__main__":
    main()
