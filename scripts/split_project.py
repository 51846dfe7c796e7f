#!/usr/bin/env python3
"""Cut an afkit project into disjoint parts by video, each a project of its own.

Comparing two filter or assembly settings on several sets of a few hundred contexts tells more
than one comparison on a thousand, and the pools of a 1,000-context project (its scorer readings
and sentence vectors included) need not be generated and scored again for that. Each part keeps
the contexts of the videos whose SHA-256 falls in it (videos without a pool are left out), with
their pools and everything stored about their endings; AF runs, assemblies, exports and
annotation are left out, so `afkit filter` starts afresh on it.

    python3 scripts/split_project.py P.sqlite --parts 3 --out part
    # part0.sqlite, part1.sqlite, part2.sqlite; then on each: afkit filter partK.sqlite ...
"""

import argparse
import hashlib
import os
import shutil
import sqlite3
import sys


def part_of(video: str, parts: int) -> int:
    return int(hashlib.sha256(video.encode()).hexdigest(), 16) % parts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("project", help="the afkit project file to cut (left unchanged)")
    ap.add_argument("--parts", type=int, default=3, help="how many parts (default 3)")
    ap.add_argument("--out", required=True, help="prefix of the parts: PREFIX0.sqlite, ...")
    args = ap.parse_args()
    if args.parts < 2:
        sys.exit("--parts must be at least 2")
    for k in range(args.parts):
        if os.path.exists(f"{args.out}{k}.sqlite"):
            sys.exit(f"{args.out}{k}.sqlite exists: remove it or choose another --out")
    for k in range(args.parts):
        dst = f"{args.out}{k}.sqlite"
        tmp = dst + ".partial"
        shutil.copyfile(args.project, tmp)
        conn = sqlite3.connect(tmp)
        conn.execute("PRAGMA foreign_keys = ON")
        # Tasks and assemblies name AF runs without cascading: they go first.
        for table in ("tasks", "assembled", "exports", "af_runs"):
            conn.execute(f"DELETE FROM {table}")
        pooled = {
            r[0]
            for r in conn.execute(
                "SELECT DISTINCT e.grp FROM examples e JOIN pools p ON p.example_id = e.id"
            )
        }
        videos = [r[0] for r in conn.execute("SELECT DISTINCT grp FROM examples")]
        drop = [(v,) for v in videos if v not in pooled or part_of(v, args.parts) != k]
        conn.executemany("DELETE FROM examples WHERE grp = ?", drop)
        conn.commit()
        pools = conn.execute("SELECT COUNT(*) FROM pools").fetchone()[0]
        kept = len(videos) - len(drop)
        conn.execute("VACUUM")
        conn.close()
        os.replace(tmp, dst)
        print(f"{dst}: {kept} videos, {pools} pooled contexts")
    return 0


if __name__ == "__main__":
    sys.exit(main())
