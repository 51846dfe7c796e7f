#!/usr/bin/env python3
"""Writes a SWAG-format dataset from an ingested afkit project, with random real endings as the
negatives: each context's three wrong endings are the found endings of contexts from other
videos, drawn with a seed. No model runs, so it is a quick real dataset for checking the audit
(and the zero-shot scoring against lm-evaluation-harness) on real captions.

Writes OUT/train.csv and OUT/val.csv (SWAG regular columns, split by video) and
OUT/lm_eval/afkit_swag.yaml (the SWAG-style harness task an afkit export has, on val).

    random_negatives_swag.py PROJECT.sqlite OUT [--seed 0] [--val-share 0.5]
"""
import argparse
import csv
import os
import random
import sqlite3

COLUMNS = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
           "ending0", "ending1", "ending2", "ending3", "label"]

TASK = """task: afkit_swag
dataset_path: csv
dataset_kwargs:
  data_files:
    train: train.csv
    validation: val.csv
  keep_default_na: false
output_type: multiple_choice
training_split: train
validation_split: validation
test_split: null
doc_to_text: startphrase
doc_to_target: label
doc_to_choice: "{{[ending0, ending1, ending2, ending3]}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("project")
    parser.add_argument("out")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--val-share", type=float, default=0.5)
    args = parser.parse_args()
    rows = sqlite3.connect(args.project).execute(
        "SELECT grp, sent1, sent2, ending FROM examples ORDER BY id").fetchall()
    rng = random.Random(args.seed)
    videos = sorted({r[0] for r in rows})
    rng.shuffle(videos)
    val_videos = set(videos[: round(len(videos) * args.val_share)])
    splits = {"train.csv": [], "val.csv": []}
    for grp, sent1, sent2, ending in rows:
        others = [r[3] for r in rows if r[0] != grp]
        endings = rng.sample(others, 3)
        label = rng.randrange(4)
        endings.insert(label, ending)
        startphrase = f"{sent1} {sent2}" if sent2 else sent1
        split = "val.csv" if grp in val_videos else "train.csv"
        splits[split].append([grp, 0, startphrase, sent1, sent2, "gold0-orig", *endings, label])
    os.makedirs(os.path.join(args.out, "lm_eval"), exist_ok=True)
    for name, records in splits.items():
        with open(os.path.join(args.out, name), "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(COLUMNS)
            w.writerows(records)
    with open(os.path.join(args.out, "lm_eval", "afkit_swag.yaml"), "w", encoding="utf-8") as f:
        f.write(TASK)
    print(f"{len(splits['train.csv'])} train and {len(splits['val.csv'])} val questions "
          f"from {len(videos)} videos in {args.out}")


if __name__ == "__main__":
    main()
