#!/usr/bin/env bash
# Measures `afkit filter` (BENCHMARKS.md, "Filter"):
#  1. a full run with default settings on a copy of the cached benchmark pool
#     (scripts/build_bench_pool.sh: 1,000 ActivityNet contexts x N- = 32 SmolLM2 endings),
#     with its report (af_accuracy.png, report.md, JSON);
#  2. time per MLP-only and per ensemble iteration on synthetic pools of 1,000 x 32, 2,000 x 32
#     and 1,000 x 64 (real captions, pools = endings of other contexts; scripts/synthetic_af_pool.py).
#
#   scripts/bench_filter.sh [POOL.sqlite]      # results under $OUT (default /tmp/afkit-bench-filter)
#
# POOL `none` skips the full run. SIZES (default "1000x32 2000x32 1000x64", contexts x N-) and
# ITERATIONS (default 3, MLP-only and ensemble each) choose the synthetic runs. Each run's
# timings end in one line `RESULT job=filter pool=... key=value ...`.
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
POOL=${1:-$HOME_DIR/bench/pool1000.sqlite}
OUT=${OUT:-/tmp/afkit-bench-filter}
SIZES=${SIZES:-1000x32 2000x32 1000x64}
ITERATIONS=${ITERATIONS:-3}
ACTIVITYNET=../shared/data/activitynet-captions/train.json
export AFKIT_NO_PROGRESS=1
mkdir -p "$OUT"

copy_db() { python3 -c 'import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()' "$1" "$2"; }
per_phase() {
  python3 - "$1" "$2" <<'PY'
import json, sys
its = json.load(open(sys.argv[1]))["iterations"]
result = {"pool": sys.argv[2]}
for phase in ("mlp", "ensemble"):
    xs = [r for r in its if r["phase"] == phase]
    if xs:
        s = sorted(r["seconds"] for r in xs)
        print(f"  {phase:<8} {len(xs):>3} iterations  mean {sum(s)/len(s):6.2f} s  median {s[len(s)//2]:6.2f} s")
        result.update({f"{phase}_iterations": len(xs), f"{phase}_mean_s": round(sum(s) / len(s), 3),
                       f"{phase}_median_s": round(s[len(s) // 2], 3)})
first, last = its[0], its[-1]
print("  first:", first["iteration"], first["phase"], first["accuracy"])
print("  last: ", last["iteration"], last["phase"], last["accuracy"])
print("RESULT job=filter " + " ".join(f"{k}={v}" for k, v in result.items()))
PY
}

if [ "$POOL" = none ]; then
  echo "full run skipped (POOL none)" >&2
elif [ -f "$POOL" ]; then
  rm -f "$OUT/real.sqlite"*
  copy_db "$POOL" "$OUT/real.sqlite"
  echo "== full run on $POOL"
  /usr/bin/time -v "$AFKIT" filter "$OUT/real.sqlite" --seed 0 --no-scorer --discriminator none 2> "$OUT/real.time" | tee "$OUT/real.log"
  grep -E "Elapsed|Maximum resident|Percent of CPU" "$OUT/real.time"
  "$AFKIT" report "$OUT/real.sqlite" --out "$OUT/real-report" --json > "$OUT/real.json"
  per_phase "$OUT/real.json" real
else
  echo "no benchmark pool at $POOL (scripts/build_bench_pool.sh builds it); skipping the full run" >&2
fi

for size in $SIZES; do
  set -- ${size/x/ }
  db="$OUT/synthetic-$1x$2.sqlite"
  if [ ! -f "$db" ]; then
    "$AFKIT" init "$db.partial" > /dev/null
    python3 scripts/synthetic_af_pool.py "$ACTIVITYNET" "$db.partial" --contexts "$1" --n-neg "$2"
    mv "$db.partial" "$db"
  fi
  work="$OUT/work-$1x$2.sqlite"
  rm -f "$work"*
  copy_db "$db" "$work"
  echo "== synthetic $1 contexts x N- = $2 ($ITERATIONS MLP-only + $ITERATIONS ensemble iterations)"
  "$AFKIT" filter "$work" --seed 0 --no-scorer --discriminator none --mlp-iterations "$ITERATIONS" --ensemble-iterations "$ITERATIONS" > "$OUT/synthetic-$1x$2.log"
  "$AFKIT" report "$work" --out "$OUT/report-$1x$2" --json > "$OUT/synthetic-$1x$2.json"
  per_phase "$OUT/synthetic-$1x$2.json" "synthetic-$1x$2"
done
