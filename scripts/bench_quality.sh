#!/usr/bin/env bash
# Quality benchmark: does a dataset built by afkit fool stylistic classifiers?
#
# From ActivityNet Captions (../shared by default) it takes a seeded set of videos from one half
# of the corpus (`dev` to tune on, `test` to report on: the halves never share a video), runs
#   init → ingest → lm adapt → generate → filter → assemble --unverified → export
# and exports the same pools twice: with the AF negatives, and with random pool negatives (the
# control, which shows what the generator alone achieves). Both are scored with one
# `afkit audit AF --cv 5 --control RANDOM --lm smollm2` (5 folds by video, mean ± standard error
# per baseline; the style and relational baselines, and each language model's zero-shot acc and
# acc_norm with the standard error of a proportion). Chance is 0.25.
#
#   scripts/bench_quality.sh [--half dev|test] [--pairs N] [--contexts N] [--seed S]
#                            [--grow N --grow-rounds R] [--no-adapt] [--label NAME]
#                            [--exclude SUBSET.json ...] [--lm MODEL ...] [--no-lm]
#                            [--base LABEL]
#                            [-- GENERATE FLAGS ...
#                            [-- FILTER FLAGS ...]]
#
#   --pairs     sentence pairs to take (before ingest's filters; default 1.25 × --contexts)
#   --contexts  contexts that get a pool (default 1000)
#   --grow N --grow-rounds R: after filtering, R times: `generate --grow N` (more endings for the
#               pools AF found starved), then filter again
#   --no-adapt  the recipe before adaptation joined the default: no `afkit lm adapt`, and
#               `generate --no-adapters` (style priming alone); --adapt is the default
#   --label     name of the recipe; the project goes to $AFKIT_HOME/bench/quality/LABEL-HALF-N
#   --exclude   the captions.json of an earlier run: its videos are left out (repeatable), for a
#               check on contexts no earlier run has seen
#   --base      start from a copy of recipe LABEL's project (same half, contexts and pools: its
#               pools are reused, not generated again), to compare filter settings on the same
#               contexts: `--label style --base default -- -- --no-scorer --discriminator none`
#               (`filter`'s default recipe reads every ending with SmolLM2 and fine-tunes MiniLM
#               as an adversary; those flags give the style-only recipe, the default before
#               2026-11-26)
#   --lm        a further language model for the audit's zero-shot rows (smollm2 or a GGUF path;
#               repeatable; also AUDIT_LM="MODEL ..."); --no-lm leaves out every model, smollm2 too
#   flags after `--` go to `afkit generate` (e.g. --n-neg 64 --style-examples 0); flags after a
#   second `--` go to `afkit filter`.
#
# Resumable: re-running with the same arguments continues the stage that was interrupted.
# Prints one table (row, AF mean ± se, control mean ± se, difference in points), the audit's
# verdict per family, and the time of every stage.
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
CAPTIONS=${CAPTIONS:-../shared/data/activitynet-captions/train.json}
HALF=test CONTEXTS=1000 PAIRS="" SEED=0 LABEL=default GROW=32 GROW_ROUNDS=0 ADAPT=1 EXCLUDE=()
BASE=
LMS=(smollm2)
# shellcheck disable=SC2206
[ -n "${AUDIT_LM:-}" ] && LMS+=($AUDIT_LM)
while [ $# -gt 0 ]; do
  case "$1" in
    --half) HALF=$2; shift 2 ;;
    --pairs) PAIRS=$2; shift 2 ;;
    --contexts) CONTEXTS=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --label) LABEL=$2; shift 2 ;;
    --grow) GROW=$2; shift 2 ;;
    --grow-rounds) GROW_ROUNDS=$2; shift 2 ;;
    --adapt) ADAPT=1; shift ;;
    --no-adapt) ADAPT=0; shift ;;
    --exclude) EXCLUDE+=(--exclude "$2"); shift 2 ;;
    --lm) LMS+=("$2"); shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --no-lm) NO_LM=1; shift ;;
    --) shift; break ;;
    *) echo "unknown argument $1 (see the header of $0)" >&2; exit 2 ;;
  esac
done
GEN_FLAGS=() FILTER_FLAGS=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do GEN_FLAGS+=("$1"); shift; done
[ $# -gt 0 ] && shift
FILTER_FLAGS=("$@")
PAIRS=${PAIRS:-$(( CONTEXTS * 5 / 4 ))}
if [ ! -f "$CAPTIONS" ]; then
  echo "no ActivityNet captions at $CAPTIONS (set CAPTIONS=...)" >&2
  exit 1
fi
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
DIR="$HOME_DIR/bench/quality/$LABEL-$HALF-$CONTEXTS"
P="$DIR/project.sqlite"
mkdir -p "$DIR"
TIMES="$DIR/times.txt"
stage() { # stage NAME COMMAND...: runs and records its wall time
  local name=$1; shift
  local t0; t0=$(date +%s%N)
  "$@"
  awk -v n="$name" -v a="$t0" -v b="$(date +%s%N)" 'BEGIN { printf "%s %.1f\n", n, (b - a) / 1e9 }' >> "$TIMES"
}
if [ ! -f "$P" ] && [ -n "$BASE" ]; then
  BASE_P="$HOME_DIR/bench/quality/$BASE-$HALF-$CONTEXTS/project.sqlite"
  [ -f "$BASE_P" ] || { echo "no project for recipe $BASE at $BASE_P" >&2; exit 1; }
  : > "$TIMES"
  cp "$(dirname "$BASE_P")/captions.json" "$DIR/captions.json"
  # A consistent copy even while the base project is open; the copy then filters anew.
  python3 -c 'import sqlite3, sys; sqlite3.connect(sys.argv[1]).backup(sqlite3.connect(sys.argv[2]))' "$BASE_P" "$P.partial"
  mv "$P.partial" "$P"
  FILTER_FLAGS+=(--new-run)
fi
if [ ! -f "$P" ]; then
  : > "$TIMES"
  python3 scripts/activitynet_subset.py "$CAPTIONS" --half "$HALF" --pairs "$PAIRS" --seed "$SEED" "${EXCLUDE[@]}" > "$DIR/captions.json"
  $AFKIT init "$P.partial" >/dev/null
  stage ingest $AFKIT ingest "$P.partial" --format activitynet "$DIR/captions.json"
  mv "$P.partial" "$P"
fi
pooled() { $AFKIT status "$P" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["contexts_with_pool"])'; }
missing=$(( CONTEXTS - $(pooled) ))
if [ "$missing" -gt 0 ]; then
  if [ "$ADAPT" = 1 ]; then
    stage adapt $AFKIT lm adapt "$P" --seed "$SEED"
  else
    GEN_FLAGS+=(--no-adapters)
  fi
  stage generate $AFKIT generate "$P" --limit "$missing" --seed "$SEED" "${GEN_FLAGS[@]}"
fi
if [ "$(pooled)" -lt "$CONTEXTS" ]; then
  echo "only $(pooled) of $CONTEXTS contexts have a pool (the subset is too small: raise --pairs)" >&2
  exit 1
fi
stage filter $AFKIT filter "$P" --seed "$SEED" "${FILTER_FLAGS[@]}"
for round in $(seq 1 "$GROW_ROUNDS"); do
  stage "grow-$round" $AFKIT generate "$P" --grow "$GROW" --seed "$SEED" "${GEN_FLAGS[@]}"
  stage "filter-$round" $AFKIT filter "$P" --seed "$SEED" "${FILTER_FLAGS[@]}"
done
stage assemble $AFKIT assemble "$P" --unverified --seed "$SEED" >/dev/null
TEST_LABELS=()
if $AFKIT export --help | grep -q -- --with-test-labels; then TEST_LABELS=(--with-test-labels); fi
for negatives in adversarial random; do
  stage "export-$negatives" $AFKIT export "$P" --out "$DIR/$negatives" --negatives "$negatives" --seed "$SEED" "${TEST_LABELS[@]}" >/dev/null
done
[ "${NO_LM:-0}" = 1 ] && LMS=()
LM_FLAGS=()
for lm in "${LMS[@]}"; do LM_FLAGS+=(--lm "$lm"); done
stage audit $AFKIT audit "$DIR/adversarial" --cv 5 --seed "$SEED" --control "$DIR/random" "${LM_FLAGS[@]}" --json > "$DIR/audit.json"
python3 - "$DIR" "$LABEL" "$HALF" "$CONTEXTS" <<'EOF'
import json, sqlite3, sys
d, label, half, contexts = sys.argv[1:5]
audit = json.load(open(f"{d}/audit.json"))
af, ctl = audit["cv"], audit["control"]["cv"]
db = sqlite3.connect(f"{d}/project.sqlite")
drawn, kept = db.execute(
    "SELECT AVG(p.draws + COALESCE((SELECT SUM(g.draws) FROM pool_growth g"
    " WHERE g.example_id = p.example_id), 0)), AVG(p.produced) FROM pools p").fetchone()
print(f"recipe {label} on the {half} half, {contexts} contexts; {af['questions']} questions, "
      f"{af['folds']} folds by video; per context {drawn or 0:.1f} endings drawn, {kept:.1f} kept")
print(f"{'row':<24} {'AF export':>14} {'random control':>16} {'diff':>6}")
for row in audit["summary"]:
    c = row.get("control")
    right = f"{c['mean']:.3f} ± {c['se']:.3f}" if c else "-"
    diff = f"{row['difference'] * 100:+.1f}" if "difference" in row else "-"
    print(f"{row['name']:<24} {row['mean']:.3f} ± {row['se']:.3f} {right:>16} {diff:>6}")
for name, b in af["baselines"].items():
    if "mean" not in b:
        print(f"{name:<24} {b.get('skipped', 'not measured')}")
for lm in audit["lm"]:
    print(f"{lm['model']}: {lm['questions']} questions scored in {lm['seconds']:.0f} s")
for v in audit["verdicts"]:
    print(f"{v['family']}: {v['text']}")
print("wall time per stage (s): " + ", ".join(
    f"{n} {t}" for n, t in (l.split() for l in open(f"{d}/times.txt"))))
EOF
