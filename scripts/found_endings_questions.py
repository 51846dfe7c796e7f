#!/usr/bin/env python3
"""Four-way questions with found distractors: a quick real set for the audit's baselines.

Each question is a context of an ingested project (sent1, sent2) with its found ending and three
found endings of other videos as distractors, at a seeded random position; at most two contexts
per video. The result is a SWAG-format folder (train.csv, val.csv, test.csv with a video-id
column) that `afkit audit DIR --cv K` pools and cuts by video. Distractors from other videos are
the easy control: a reader that relates an ending to its context should beat chance by far, so
the set checks that a context-reading baseline learns on real text.

    afkit init P.sqlite && afkit ingest --format activitynet P.sqlite train.json
    python3 scripts/found_endings_questions.py P.sqlite OUT_DIR [--questions 400] [--seed 1]
    afkit audit OUT_DIR --cv 5
"""
import argparse
import csv
import os
import random
import sqlite3

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("project")
parser.add_argument("out")
parser.add_argument("--questions", type=int, default=400)
parser.add_argument("--seed", type=int, default=1)
args = parser.parse_args()

rng = random.Random(args.seed)
rows = sqlite3.connect(args.project).execute(
    "SELECT ext_id, grp, sent1, sent2, ending FROM examples ORDER BY ext_id").fetchall()
by_video = {}
for row in rows:
    by_video.setdefault(row[1], []).append(row)
videos = sorted(by_video)
rng.shuffle(videos)
chosen = []
for video in videos:
    chosen.extend(by_video[video][:2])
    if len(chosen) >= args.questions:
        break
chosen = chosen[:args.questions]

os.makedirs(args.out, exist_ok=True)
header = ["id", "video-id", "sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"]
splits = {"train.csv": [], "val.csv": [], "test.csv": []}
for i, (ext_id, video, sent1, sent2, ending) in enumerate(chosen):
    distractors = []
    while len(distractors) < 3:
        other = rng.choice(rows)
        if other[1] != video and other[4] != ending and other[4] not in distractors:
            distractors.append(other[4])
    label = rng.randrange(4)
    endings = distractors[:label] + [ending] + distractors[label:]
    split = ["train.csv", "val.csv", "test.csv"][i % 3]
    splits[split].append([ext_id, video, sent1, sent2] + endings + [label])
for name, records in splits.items():
    with open(os.path.join(args.out, name), "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        writer.writerows(records)
print(f"{args.out}: {len(chosen)} questions from {len({c[1] for c in chosen})} videos")
