"""Loads an afkit export with Hugging Face `datasets` as a user would and checks every row.

Usage: python check_datasets.py EXPORT_DIR

Every configuration the card declares (`regular`, the default, and `full`) and the JSONL folder
are loaded with `datasets.load_dataset`; each split must have exactly the rows of its file, read
here independently with the `csv` / `json` modules, with the declared types (strings stay
strings, empty cells are "", labels are ints). Prints one line per split; exits non-zero on the
first mismatch.
"""

import csv
import json
import os
import sys

import datasets

SPLIT_FILES = {"train": "train", "validation": "val", "test": "test"}
REGULAR = ["video-id", "fold-ind", "startphrase", "sent1", "sent2", "gold-source",
           "ending0", "ending1", "ending2", "ending3", "label", "could-be-right"]
INT_COLUMNS = ("label", "could-be-right")


def fail(message):
    print(f"FAIL: {message}")
    sys.exit(1)


def csv_rows(path):
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def check_split(name, loaded, expected, columns):
    if loaded.column_names != columns:
        fail(f"{name}: columns {loaded.column_names}, expected {columns}")
    if len(loaded) != len(expected):
        fail(f"{name}: {len(loaded)} rows, the file has {len(expected)}")
    for i, (got, want) in enumerate(zip(loaded, expected)):
        if got != want:
            fail(f"{name} row {i}: loaded {got!r}, file has {want!r}")
    print(f"ok {name}: {len(loaded)} rows")


def present_splits(folder):
    """The splits whose regular CSV the export wrote (an empty split has none)."""
    return {split: stem for split, stem in SPLIT_FILES.items()
            if os.path.exists(os.path.join(folder, f"{stem}.csv"))}


def check_regular(folder, config):
    loaded = datasets.load_dataset(folder, config) if config else datasets.load_dataset(folder)
    if sorted(loaded) != sorted(present_splits(folder)):
        fail(f"regular: splits {sorted(loaded)}")
    for split, stem in present_splits(folder).items():
        features = loaded[split].features
        if any(features[c].dtype != "int64" for c in INT_COLUMNS) \
                or features["fold-ind"].dtype != "string":
            fail(f"regular/{split}: types {features}")
        rows = [{c: (int(r[c]) if c in INT_COLUMNS else r[c]) for c in REGULAR}
                for r in csv_rows(os.path.join(folder, f"{stem}.csv"))]
        check_split(f"regular/{split}", loaded[split], rows, REGULAR)


def check_full(folder):
    loaded = datasets.load_dataset(folder, "full")
    for split, stem in present_splits(folder).items():
        path = os.path.join(folder, f"{stem}_full.csv")
        if not os.path.exists(path):
            if split in loaded:
                fail(f"full has a {split} split without {path}")
            continue
        rows = csv_rows(path)
        columns = list(rows[0].keys()) if rows else []
        for name, feature in loaded[split].features.items():
            if feature.dtype != "string":
                fail(f"full/{split}: {name} is {feature.dtype}, expected string")
        check_split(f"full/{split}", loaded[split], rows, columns)


def check_jsonl(folder):
    loaded = datasets.load_dataset("json", data_dir=os.path.join(folder, "jsonl"))
    for split, stem in present_splits(folder).items():
        with open(os.path.join(folder, "jsonl", f"{stem}.jsonl"), encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
        check_split(f"jsonl/{split}", loaded[split], rows, list(rows[0].keys()))


def main():
    folder = sys.argv[1]
    check_regular(folder, None)
    check_regular(folder, "regular")
    check_full(folder)
    check_jsonl(folder)
    print("all configurations load")


if __name__ == "__main__":
    main()
