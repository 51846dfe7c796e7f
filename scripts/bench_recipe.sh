#!/usr/bin/env bash
# The README's default recipe, timed stage by stage, on held-out ActivityNet contexts:
#   lm adapt → generate → filter → assemble --unverified → export → audit --cv 5 --lm smollm2
# with every default (N⁻ = 64, the scorer model, the fine-tuned adversary). The clock covers
# `lm adapt` to `audit`; building the subset, `init` and `ingest` come before it. Afterwards, not
# timed, the same pools are exported with random distractors and audited alike (the control), so
# the run also says how hard its export is.
#
#   scripts/bench_recipe.sh [--contexts N] [--seed S] [--label NAME] [--no-control]
#
#   --contexts  contexts that get a pool (default 1000; the subset takes 1.25 × as many pairs)
#   --seed      seed of the subset and of every stage (default 104)
#   --label     the project goes to $AFKIT_HOME/bench/recipe/LABEL-sSEED-N (default: default)
#   --no-control  skip the control's export and audit
#
# AFKIT=PATH times another build (an older commit's, for a before/after on one machine); the
# first line of times.txt names the binary, and the commit of the scripts beside it.
#
# Run it on an otherwise idle machine: the figures are wall-clock times. `nice` does not make room
# for other work where the kernel shares the CPU between sessions first
# (/proc/sys/kernel/sched_autogroup_enabled = 1): a job at nice 19 started from another terminal
# takes as much CPU as this script. AFKIT_SIMD=avx2 gives the
# AVX2-only figure on an AVX-512 machine. Prints one line per stage and the total; the same lines
# go to times.txt in the project's folder. Not resumable: an existing folder is an error.
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
CAPTIONS=${CAPTIONS:-../shared/data/activitynet-captions/train.json}
CONTEXTS=1000 SEED=104 LABEL=default CONTROL=1
while [ $# -gt 0 ]; do
  case "$1" in
    --contexts) CONTEXTS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    --no-control) CONTROL=0; shift ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
[ -f "$CAPTIONS" ] || { echo "no ActivityNet captions at $CAPTIONS (set CAPTIONS=...)" >&2; exit 1; }
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
DIR="$HOME_DIR/bench/recipe/$LABEL-s$SEED-$CONTEXTS"
[ -e "$DIR" ] && { echo "$DIR exists: remove it or pick another --label" >&2; exit 1; }
mkdir -p "$DIR"
P="$DIR/project.sqlite" TIMES="$DIR/times.txt"
export AFKIT_NO_PROGRESS=1
stage() { # stage NAME COMMAND...: runs, logs to NAME.log and records its wall time
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  "$@" > "$DIR/$name.log" 2>&1 || { echo "$name failed: see $DIR/$name.log" >&2; exit 1; }
  awk -v n="$name" -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%-10s %8.1f s\n", n, (b - a) / 1e9 }' | tee -a "$TIMES"
}
echo "$AFKIT: $($AFKIT --version) (scripts at $(git rev-parse --short HEAD 2>/dev/null || echo "no git")), AFKIT_SIMD=${AFKIT_SIMD:-auto}; CPU flags:" \
  "$(grep -o -w 'avx2\|avx512[a-z_0-9]*\|amx[a-z_0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')" | tee "$TIMES"
python3 scripts/activitynet_subset.py "$CAPTIONS" --half test --pairs $((CONTEXTS * 5 / 4)) --seed "$SEED" > "$DIR/captions.json"
$AFKIT init "$P" > /dev/null
$AFKIT ingest "$P" --format activitynet "$DIR/captions.json" > "$DIR/ingest.log" 2>&1
stage adapt $AFKIT lm adapt "$P" --seed "$SEED"
stage generate $AFKIT generate "$P" --limit "$CONTEXTS" --seed "$SEED"
stage filter $AFKIT filter "$P" --seed "$SEED"
stage assemble $AFKIT assemble "$P" --unverified --seed "$SEED"
stage export $AFKIT export "$P" --out "$DIR/adversarial" --seed "$SEED" --with-test-labels
stage audit $AFKIT audit "$DIR/adversarial" --cv 5 --lm smollm2 --seed "$SEED"
awk '/ s$/ { total += $2 } END { printf "%-10s %8.1f s (%.1f min), lm adapt to audit\n", "total", total, total / 60 }' "$TIMES" | tee -a "$TIMES"
[ "$CONTROL" = 1 ] || exit 0
$AFKIT export "$P" --out "$DIR/random" --negatives random --seed "$SEED" --with-test-labels > /dev/null
$AFKIT audit "$DIR/random" --cv 5 --lm smollm2 --seed "$SEED" > "$DIR/audit-control.log" 2>&1
python3 - "$DIR" <<'EOF'
import json, sys
af, ctl = (json.load(open(f"{sys.argv[1]}/{name}/audit/audit.json")) for name in ("adversarial", "random"))
print(f"{af['cv']['questions']} questions, {af['cv']['folds']} folds by video")
print(f"{'row':<24} {'AF export':>14} {'random control':>16}")
control = {row["name"]: row for row in ctl["summary"]}
for row in af["summary"]:
    c = control.get(row["name"])
    right = f"{c['mean']:.3f} ± {c['se']:.3f}" if c else "-"
    print(f"{row['name']:<24} {row['mean']:.3f} ± {row['se']:.3f} {right:>16}")
EOF
