#!/usr/bin/env bash
# Measures `afkit filter` (BENCHMARKS.md, "Filter"):
#  1. a full run with default settings on a copy of the cached benchmark pool
#     (scripts/build_bench_pool.sh: 1,000 ActivityNet contexts x N- = 32 SmolLM2 endings),
#     with its report (af_accuracy.png, report.md, JSON);
#  2. time per MLP-only and per ensemble iteration on synthetic pools of 1,000 x 32, 2,000 x 32
#     and 1,000 x 64 (real captions, pools = endings of other contexts; scripts/synthetic_af_pool.py).
#
#   scripts/bench_filter.sh [POOL.sqlite]      # results under $OUT (default /tmp/afkit-bench-filter)
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
POOL=${1:-$HOME_DIR/bench/pool1000.sqlite}
OUT=${OUT:-/tmp/afkit-bench-filter}
ACTIVITYNET=../shared/data/activitynet-captions/train.json
export AFKIT_NO_PROGRESS=1
mkdir -p "$OUT"

copy_db() { python3 -c 'import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()' "$1" "$2"; }
per_phase() {
  python3 - "$1" <<'PY'
import json, sys
its = json.load(open(sys.argv[1]))["iterations"]
for phase in ("mlp", "ensemble"):
    xs = [r for r in its if r["phase"] == phase]
    if xs:
        s = sorted(r["seconds"] for r in xs)
        print(f"  {phase:<8} {len(xs):>3} iterations  mean {sum(s)/len(s):6.2f} s  median {s[len(s)//2]:6.2f} s")
first, last = its[0], its[-1]
print("  first:", first["iteration"], first["phase"], first["accuracy"])
print("  last: ", last["iteration"], last["phase"], last["accuracy"])
PY
}

if [ -f "$POOL" ]; then
  rm -f "$OUT/real.sqlite"*
  copy_db "$POOL" "$OUT/real.sqlite"
  echo "== full run on $POOL"
  /usr/bin/time -v "$AFKIT" filter "$OUT/real.sqlite" --seed 0 2> "$OUT/real.time" | tee "$OUT/real.log"
  grep -E "Elapsed|Maximum resident|Percent of CPU" "$OUT/real.time"
  "$AFKIT" report "$OUT/real.sqlite" --out "$OUT/real-report" --json > "$OUT/real.json"
  per_phase "$OUT/real.json"
else
  echo "no benchmark pool at $POOL (scripts/build_bench_pool.sh builds it); skipping the full run" >&2
fi

for size in "1000 32" "2000 32" "1000 64"; do
  set -- $size
  db="$OUT/synthetic-$1x$2.sqlite"
  if [ ! -f "$db" ]; then
    "$AFKIT" init "$db.partial" > /dev/null
    python3 scripts/synthetic_af_pool.py "$ACTIVITYNET" "$db.partial" --contexts "$1" --n-neg "$2"
    mv "$db.partial" "$db"
  fi
  work="$OUT/work-$1x$2.sqlite"
  rm -f "$work"*
  copy_db "$db" "$work"
  echo "== synthetic $1 contexts x N- = $2 (3 MLP-only + 3 ensemble iterations)"
  "$AFKIT" filter "$work" --seed 0 --mlp-iterations 3 --ensemble-iterations 3 > "$OUT/synthetic-$1x$2.log"
  "$AFKIT" report "$work" --out "$OUT/report-$1x$2" --json > "$OUT/synthetic-$1x$2.json"
  per_phase "$OUT/synthetic-$1x$2.json"
done
