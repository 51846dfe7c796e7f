#!/usr/bin/env bash
# The big-project check (BENCHMARKS.md, "Big projects"): a synthetic project of CONTEXTS x N-
# candidates goes through init → ingest → import-pool (scored pools) → status → filter (MLP-only
# iterations) → assemble --unverified → export, each stage timed with its peak memory (max RSS)
# and the project file's size after it.
#
#   scripts/bench_big_project.sh [CONTEXTS] [N_NEG] [MLP_ITERATIONS]   # default 100000 256 5
#
# Captions come from ../shared/data/activitynet-captions/train.json when present, else from the
# built-in sample. Results: $OUT/summary.md (default OUT=/tmp/afkit-big), logs beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTS=${1:-100000}
N_NEG=${2:-256}
MLP_ITERATIONS=${3:-5}
AFKIT=${AFKIT:-target/release/afkit}
OUT=${OUT:-/tmp/afkit-big}
CAPTIONS=../shared/data/activitynet-captions/train.json
[ -f "$CAPTIONS" ] || CAPTIONS=data/sample/captions.json
export AFKIT_NO_PROGRESS=1
[ -x "$AFKIT" ] || cargo build --release --locked
mkdir -p "$OUT"
project="$OUT/big.sqlite"
rm -rf "$project" "$project"-* "$OUT/export" "$OUT"/*.time "$OUT"/*.log

echo "== writing the synthetic inputs ($CONTEXTS contexts x $N_NEG candidates, captions: $CAPTIONS)"
if [ ! -f "$OUT/inputs-$CONTEXTS-$N_NEG/pools.jsonl" ]; then
  python3 scripts/synthetic_big_project.py "$CAPTIONS" "$OUT/inputs-$CONTEXTS-$N_NEG" \
    --contexts "$CONTEXTS" --n-neg "$N_NEG"
fi
inputs="$OUT/inputs-$CONTEXTS-$N_NEG"

summary="$OUT/summary.md"
{
  echo "Project: $CONTEXTS contexts x N- = $N_NEG; afkit $("$AFKIT" --version | cut -d' ' -f2);"
  echo "$(nproc) cores; $(date -u +%Y-%m-%d)."
  echo
  echo "| stage | wall s | peak RSS MiB | project file MiB (after) |"
  echo "| --- | ---: | ---: | ---: |"
} > "$summary"

stage() {
  local name=$1
  shift
  echo "== $name: afkit $*"
  /usr/bin/time -f '%e %M' -o "$OUT/$name.time" "$AFKIT" "$@" > "$OUT/$name.log" 2>&1 || {
    cat "$OUT/$name.log"
    exit 1
  }
  tail -n 3 "$OUT/$name.log"
  read -r wall rss < "$OUT/$name.time"
  # The file and its write-ahead log together: what the stage leaves on disk.
  size=$(stat -c %s "$project")
  [ -f "$project-wal" ] && size=$((size + $(stat -c %s "$project-wal")))
  printf '| %s | %.1f | %d | %d |\n' "$name" "$wall" $((rss / 1024)) $((size / 1048576)) >> "$summary"
}

stage init init "$project"
stage ingest ingest "$project" --format jsonl "$inputs/examples.jsonl"
stage import-pool import-pool "$project" "$inputs/pools.jsonl"
stage status status "$project" --json
stage filter filter "$project" --mlp-iterations "$MLP_ITERATIONS" --ensemble-iterations 0 --seed 0
stage report report "$project" --out "$OUT/report" --json
stage assemble assemble "$project" --unverified --seed 0
stage export export "$project" --out "$OUT/export"
stage export-random export "$project" --out "$OUT/export-random" --negatives random
stage status-after status "$project" --json

{
  echo
  echo "filter iterations (seconds each):"
  grep -E '^iteration' "$OUT/filter.log" | sed 's/^/    /'
  echo
  echo "status after import: $(cat "$OUT/status.log")"
  echo "status at the end: $(cat "$OUT/status-after.log")"
  echo "export: $(du -sh "$OUT/export" | cut -f1) in $(ls "$OUT/export" | wc -l) files"
} >> "$summary"
cat "$summary"
