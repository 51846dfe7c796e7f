#!/usr/bin/env bash
# Audit of the AF export vs the random-negatives control on the cached benchmark pool
# (BENCHMARKS.md, "Audit: AF vs random negatives").
#
#   scripts/bench_audit.sh [POOL.sqlite]     # default: $AFKIT_HOME/bench/pool1000.sqlite
#
# The pool comes from scripts/build_bench_pool.sh. The script works on a copy (the cached pool is
# left as it is); if the copy has no finished AF run it runs `afkit filter` first (extra filter
# flags in $FILTER_ARGS). Then: assemble --unverified → export (AF negatives) and export
# --negatives random (same contexts and golds, distractors drawn from the pre-AF pool) → audit
# both → one markdown table on stdout. Work files stay in $WORK (printed).
set -euo pipefail
cd "$(dirname "$0")/.."
AFKIT=${AFKIT:-target/release/afkit}
HOME_DIR=${AFKIT_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/afkit}
POOL=${1:-$HOME_DIR/bench/pool1000.sqlite}
SEED=${SEED:-0}
[ -x "$AFKIT" ] || cargo build --release
[ -f "$POOL" ] || { echo "no pool at $POOL: run scripts/build_bench_pool.sh first" >&2; exit 1; }
WORK=${WORK:-$(mktemp -d -t afkit-bench-audit.XXXXXX)}
echo "work dir: $WORK" >&2
cp "$POOL" "$WORK/project.sqlite"
P="$WORK/project.sqlite"
finished=$(python3 - "$P" <<'EOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
print(c.execute("SELECT COUNT(*) FROM af_runs WHERE finished_at IS NOT NULL").fetchone()[0])
EOF
)
if [ "$finished" = 0 ]; then
  echo "no finished AF run in the pool: running afkit filter $FILTER_ARGS" >&2
  # shellcheck disable=SC2086
  $AFKIT filter "$P" --seed "$SEED" ${FILTER_ARGS:-}
fi
$AFKIT assemble "$P" --unverified --seed "$SEED" >&2
rm -rf "$WORK/af" "$WORK/random"
$AFKIT export "$P" --out "$WORK/af" --seed "$SEED" >&2
$AFKIT export "$P" --out "$WORK/random" --negatives random --seed "$SEED" >&2
/usr/bin/time -v $AFKIT audit "$WORK/af" --json --seed "$SEED" > "$WORK/af.json" 2> "$WORK/af.time"
/usr/bin/time -v $AFKIT audit "$WORK/random" --json --seed "$SEED" > "$WORK/random.json" 2> "$WORK/random.time"
python3 - "$WORK" <<'EOF'
import json, sys, re
work = sys.argv[1]
af = json.load(open(f"{work}/af.json"))
rnd = json.load(open(f"{work}/random.json"))
def wall(name):
    m = re.search(r"Elapsed \(wall clock\) time.*: (\S+)", open(f"{work}/{name}.time").read())
    return m.group(1) if m else "?"
print(f"AF export: {af['n_train']} train / {af['n_val']} val questions; random control: "
      f"{rnd['n_train']} / {rnd['n_val']}.\n")
print("| measure | AF negatives | random negatives |")
print("| --- | ---: | ---: |")
for key in ["random", "shortest", "longest", "ngram_end", "ngram_s2", "ngram_ctx"]:
    print(f"| {key} | {af[key]:.3f} | {rnd[key]:.3f} |")
ka, kr = af["knn"], rnd["knn"]
if "val_to_train" in ka and "val_to_train" in kr:
    for i, kk in enumerate(ka["k"]):
        print(f"| knn val→train top {kk} | {ka['val_to_train'][i]:.4f} | {kr['val_to_train'][i]:.4f} |")
    for cls in ka["by_class"]:
        print(f"| knn endings {cls} top 1 | {ka['by_class'][cls][0]:.4f} | {kr['by_class'][cls][0]:.4f} |")
print(f"| audit wall time | {wall('af')} | {wall('random')} |")
def top(rep, label):
    words = [f"{a['word']} ({a['ppmi']:.2f})" for a in rep["ppmi"] if a["label"] == label]
    return ", ".join(words[:8])
print()
print(f"Top PPMI gold words, AF: {top(af, 'gold')}")
print(f"Top PPMI gold words, random: {top(rnd, 'gold')}")
EOF
