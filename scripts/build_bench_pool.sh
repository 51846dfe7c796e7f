#!/usr/bin/env bash
# Builds the shared benchmark pool once and caches it outside the repository:
# 1,000 ActivityNet training contexts from ../shared, N⁻ = 32 SmolLM2 endings each, seed 0.
# The filter, export and AFLite benchmarks reuse it. Resumable: re-running continues an
# interrupted build; a finished pool is left as it is. Prints the project's path.
#
#   scripts/build_bench_pool.sh            # → $AFKIT_HOME/bench/pool1000.sqlite
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
POOL="$HOME_DIR/bench/pool1000.sqlite"
CONTEXTS=1000
mkdir -p "$(dirname "$POOL")"
if [ ! -f "$POOL" ]; then
  $AFKIT init "$POOL.partial"
  $AFKIT ingest "$POOL.partial" --format activitynet ../shared/data/activitynet-captions/train.json
  mv "$POOL.partial" "$POOL"
fi
pooled() { $AFKIT status "$POOL" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["contexts_with_pool"])'; }
start=$(date +%s)
# `--limit` counts contexts without a pool, so after an interruption only the rest is generated.
missing=$(( CONTEXTS - $(pooled) ))
if [ "$missing" -gt 0 ]; then
  $AFKIT generate "$POOL" --limit "$missing" --n-neg 32 --seed 0
fi
done_now=$(pooled)
if [ "$done_now" -lt "$CONTEXTS" ]; then
  echo "only $done_now of $CONTEXTS contexts have a pool; run again to continue" >&2
  exit 1
fi
echo "built in $(( $(date +%s) - start )) s" >&2
echo "$POOL"
