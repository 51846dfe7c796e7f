#!/usr/bin/env bash
# Two afkit binaries on the default recipe's `generate`, in one run: the same ActivityNet
# contexts, the same adapters (`lm adapt` once, by the second binary), each binary run ROUNDS
# times, alternately, on a fresh copy of the adapted project. Prints each run's whole time and
# sampling rate, then whether both binaries wrote the same endings and features (a speed change
# that should not change results is checked here too).
#
#   scripts/bench_generate_pair.sh BEFORE AFTER [CONTEXTS=20] [ROUNDS=2] [SEED=5]
#
# CONTEXTS is at least 20: `lm adapt` needs that many captions' worth of text for its folds.
# SAMPLED=N samples only the first N of them (default all): adapters trained on a project's worth
# of captions, a pass short enough to repeat.
#
# BEFORE and AFTER are afkit binaries (e.g. one built from an earlier commit with
# `git worktree add` and `cargo build --release`). The contexts are test-half ActivityNet
# captions drawn with seed 99 (scripts/activitynet_subset.py); set AFKIT_SIMD=avx2 to time the
# AVX2 kernels. BEFORE_FLAGS and AFTER_FLAGS add `generate` flags to one binary's runs (e.g. to
# give both the same sampling when their defaults differ), BEFORE_ENV and AFTER_ENV environment
# settings (e.g. `BEFORE_ENV=AFKIT_SIMD=avx512` with the same binary on both sides: the f32
# kernels against AMX's bf16 tiles). The last line: one
# `RESULT job=generate_pair ...` summary (medians).
set -euo pipefail
cd "$(dirname "$0")/.."
BEFORE=$(realpath "$1") AFTER=$(realpath "$2")
CONTEXTS=${3:-20} ROUNDS=${4:-2} SEED=${5:-5}
SAMPLED=${SAMPLED:-$CONTEXTS}
CAPTIONS=${CAPTIONS:-../shared/data/activitynet-captions/train.json}
export AFKIT_NO_PROGRESS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

python3 scripts/activitynet_subset.py "$CAPTIONS" --half test --pairs $((CONTEXTS * 5 / 4 + 1)) \
  --seed 99 > "$work/captions.json"
mkdir "$work/base"
"$AFTER" init "$work/base/p.sqlite" >/dev/null
"$AFTER" ingest "$work/base/p.sqlite" --format activitynet "$work/captions.json" >/dev/null
"$AFTER" lm adapt "$work/base/p.sqlite" --seed "$SEED" > "$work/adapt.log" 2>&1 ||
  { cat "$work/adapt.log" >&2; exit 1; }

run() { # NAME BINARY ROUND FLAGS ENV
  rm -rf "$work/run" && cp -r "$work/base" "$work/run"
  # shellcheck disable=SC2086
  (cd "$work/run" && env $5 "$2" generate p.sqlite --limit "$SAMPLED" --seed "$SEED" $4 --json) \
    > "$work/$1-$3.json"
  sqlite3 "$work/run/p.sqlite" "SELECT * FROM endings ORDER BY id" | md5sum | cut -c1-32 \
    > "$work/$1-$3.endings"
}
for round in $(seq "$ROUNDS"); do
  echo "round $round: before" >&2
  run before "$BEFORE" "$round" "${BEFORE_FLAGS:-}" "${BEFORE_ENV:-}"
  echo "round $round: after" >&2
  run after "$AFTER" "$round" "${AFTER_FLAGS:-}" "${AFTER_ENV:-}"
done

python3 - "$work" "$ROUNDS" "$SAMPLED" <<'PY'
import json, statistics, sys
w, rounds, contexts = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
runs = {name: [json.load(open(f"{w}/{name}-{r}.json")) for r in range(1, rounds + 1)]
        for name in ("before", "after")}
endings = {open(f"{w}/{name}-{r}.endings").read().strip()
           for name in ("before", "after") for r in range(1, rounds + 1)}
for name, rs in runs.items():
    for r in rs:
        print(f"{name:<7} generate {r['total_seconds']:8.1f} s   sampling "
              f"{r['sampling_endings_per_second']:6.2f} endings/s   {r['tokens_generated']} tokens drawn")
med = {name: (statistics.median(r["total_seconds"] for r in rs),
              statistics.median(r["sampling_endings_per_second"] for r in rs))
       for name, rs in runs.items()}
same = len(endings) == 1
print(f"same endings and features in every run: {'yes' if same else 'NO'}")
print(f"after / before: generate time {med['after'][0] / med['before'][0]:.3f}, "
      f"sampling rate {med['after'][1] / med['before'][1]:.3f}")
print(f"RESULT job=generate_pair contexts={contexts} rounds={rounds} "
      f"before_s={med['before'][0]:.1f} after_s={med['after'][0]:.1f} "
      f"before_sampling={med['before'][1]:.2f} after_sampling={med['after'][1]:.2f} "
      f"before_tokens={runs['before'][0]['tokens_generated']} "
      f"after_tokens={runs['after'][0]['tokens_generated']} "
      f"same_results={'yes' if same else 'no'}")
PY
