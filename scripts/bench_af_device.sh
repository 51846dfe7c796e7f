#!/usr/bin/env bash
# One ensemble AF iteration on a synthetic project, per device (BENCHMARKS.md, "AF on a GPU"):
# real ActivityNet caption pairs (or the built-in sample), CONTEXTS contexts x N- candidates with
# scored LM features (scripts/synthetic_big_project.py), then for each DEVICE a fresh copy runs
# `afkit filter --mlp-iterations 0 --ensemble-iterations 1` until its first iteration is stored,
# and the iteration's seconds (total and training) are printed side by side.
#
#   scripts/bench_af_device.sh [CONTEXTS] [N_NEG] [DEVICE...]   # default: 10000 32 cpu
#   scripts/bench_af_device.sh 10000 32 cpu cuda                # needs a build with --features cuda
#
# AFKIT defaults to target/release/afkit; results in $OUT (default /tmp/afkit-af-device).
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTS=${1:-10000}
N_NEG=${2:-32}
shift $(($# < 2 ? $# : 2))
DEVICES=("$@")
[ ${#DEVICES[@]} -gt 0 ] || DEVICES=(cpu)
AFKIT=${AFKIT:-target/release/afkit}
OUT=${OUT:-/tmp/afkit-af-device}
CAPTIONS=../shared/data/activitynet-captions/train.json
[ -f "$CAPTIONS" ] || CAPTIONS=data/sample/captions.json
export AFKIT_NO_PROGRESS=1
[ -x "$AFKIT" ] || cargo build --release --locked
mkdir -p "$OUT"

inputs="$OUT/inputs-$CONTEXTS-$N_NEG"
[ -f "$inputs/pools.jsonl" ] ||
  python3 scripts/synthetic_big_project.py "$CAPTIONS" "$inputs" --contexts "$CONTEXTS" --n-neg "$N_NEG"
pristine="$OUT/pristine-$CONTEXTS-$N_NEG.sqlite"
if [ ! -f "$pristine" ]; then
  rm -f "$pristine".tmp*
  "$AFKIT" init "$pristine.tmp" > /dev/null
  "$AFKIT" ingest "$pristine.tmp" --format jsonl "$inputs/examples.jsonl" > /dev/null
  "$AFKIT" import-pool "$pristine.tmp" "$inputs/pools.jsonl" > /dev/null
  python3 -c 'import sqlite3,sys; s=sqlite3.connect(sys.argv[1]); d=sqlite3.connect(sys.argv[2]); s.backup(d); d.close()' \
    "$pristine.tmp" "$pristine"
  rm -f "$pristine".tmp*
fi

echo "one ensemble iteration, $CONTEXTS contexts x N- = $N_NEG (k = 9, 80/20 split), $(date -u +%F)"
for device in "${DEVICES[@]}"; do
  project="$OUT/$device.sqlite"
  rm -f "$project"*
  cp "$pristine" "$project"
  log="$OUT/$device.log"
  "$AFKIT" filter "$project" --device "$device" --no-scorer --discriminator none --mlp-iterations 0 --ensemble-iterations 1 \
    --seed 0 > "$log" 2>&1 &
  pid=$!
  # The iteration is committed before its line is printed; the final pass is not timed here.
  until grep -q '^iteration' "$log" || ! kill -0 "$pid" 2> /dev/null; do sleep 1; done
  kill "$pid" 2> /dev/null || true
  wait "$pid" 2> /dev/null || true
  line=$(grep '^iteration' "$log" || true)
  if [ -z "$line" ]; then
    echo "$device: no iteration (see $log)"
    tail -n 5 "$log"
    continue
  fi
  echo "$device: $line"
done
