#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ in turn, SECONDS each (default 600), and prints one line per
# target: executions, coverage, and whether it found a crash (saved under fuzz/artifacts/TARGET/).
#
#   scripts/fuzz_all.sh [SECONDS] [TARGET ...]
#
# Needs cargo-fuzz (`cargo install cargo-fuzz`); a stable toolchain builds it with
# RUSTC_BOOTSTRAP=1. The corpora grow in fuzz/corpus/TARGET and start from fuzz/seeds/TARGET
# (small inputs written for afkit); gguf_tokenizer starts from the first 16 KB of the default
# model when `afkit models fetch` has installed it. detect_odr_violation=0: the bundled SQLite
# is reported twice by AddressSanitizer's one-definition check, which stops every target at
# start-up otherwise.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
SECONDS_EACH=${1:-600}
[ $# -gt 0 ] && shift
TARGETS=("$@")
[ ${#TARGETS[@]} -gt 0 ] || mapfile -t TARGETS < <(RUSTC_BOOTSTRAP=1 cargo fuzz list)
RUSTC_BOOTSTRAP=1 cargo fuzz build -O >&2
GGUF=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}/models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
mkdir -p seeds/gguf_tokenizer
if [ -f "$GGUF" ] && [ ! -f seeds/gguf_tokenizer/model-head.gguf ]; then
  head -c 16384 "$GGUF" > seeds/gguf_tokenizer/model-head.gguf
fi
for t in "${TARGETS[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t" "seeds/$t"
  log="artifacts/$t/last-run.log"
  status=0
  ASAN_OPTIONS=detect_odr_violation=0 "target/x86_64-unknown-linux-gnu/release/$t" \
    "corpus/$t" "seeds/$t" -max_total_time="$SECONDS_EACH" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="artifacts/$t/" > "$log" 2>&1 || status=$?
  done_line=$(grep -E '^#[0-9]+\s+DONE' "$log" | tail -1 || true)
  if [ "$status" -eq 0 ]; then
    echo "$t: ${SECONDS_EACH} s, no crash; $done_line"
  else
    echo "$t: stopped with status $status after finding an input; see $log and artifacts/$t/"
  fi
done
