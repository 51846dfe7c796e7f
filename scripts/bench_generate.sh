#!/usr/bin/env bash
# Benchmark of `afkit generate` against llama.cpp (llama-cpp-python) on the same job, in one run:
# ActivityNet contexts from ../shared, N⁻ endings each, SmolLM2-135M-Instruct Q4_1, 2 threads.
#
#   scripts/bench_generate.sh [CONTEXTS=200] [PEER_CONTEXTS=CONTEXTS] [N_NEG=64]
#
# Needs a release build (cargo build --release) and llama-cpp-python importable by $PYTHON
# (default python3); build it with the CMAKE_ARGS given in BENCHMARKS.md. The peer is slow, so
# PEER_CONTEXTS may be a prefix of the contexts: afkit is then also run on exactly that prefix
# and the ratio is taken on the same contexts. Without llama_cpp the peer is skipped ("peer
# missing") and afkit's figures are printed alone. The last lines: one `RESULT job=generate
# key=value ...` summary (endings/s on the peer's contexts), then all figures as JSON.
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTS=${1:-200}
PEER_CONTEXTS=${2:-$CONTEXTS}
N_NEG=${3:-64}
PYTHON=${PYTHON:-python3}
AFKIT=target/release/afkit
export RAYON_NUM_THREADS=2 AFKIT_NO_PROGRESS=1
# The peer's job: the context alone as the prompt, plain sampling and the plain stop rules, so
# afkit runs without its style priming, its truncated sampling and its corpus-derived ending
# rules here (all add or change work the peer does not do). AFKIT_GEN_FLAGS adds flags to
# afkit's runs.
GEN=(--style-examples 0 --no-ending-rules --temperature 1 --min-p 0 ${AFKIT_GEN_FLAGS:-})
DATA=../shared/data/activitynet-captions/train.json
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

MODEL=$($AFKIT models fetch smollm2 | sed 's/^SmolLm2: //')/SmolLM2-135M-Instruct.Q4_1.gguf
project() {
  $AFKIT init "$work/$1.sqlite" >/dev/null
  $AFKIT ingest "$work/$1.sqlite" --format activitynet "$DATA" >/dev/null
}
project all
project peer

echo "afkit generate: $CONTEXTS contexts, N-=$N_NEG" >&2
$AFKIT generate "$work/all.sqlite" --limit "$CONTEXTS" --n-neg "$N_NEG" "${GEN[@]}" --json > "$work/afkit_all.json"
echo "afkit generate: first $PEER_CONTEXTS contexts" >&2
$AFKIT generate "$work/peer.sqlite" --limit "$PEER_CONTEXTS" --n-neg "$N_NEG" "${GEN[@]}" --json > "$work/afkit_subset.json"
if $PYTHON -c 'import llama_cpp' 2>/dev/null; then
  echo "peer (llama-cpp-python): first $PEER_CONTEXTS contexts" >&2
  $PYTHON scripts/bench_generate_peer.py --project "$work/peer.sqlite" --model "$MODEL" \
    --limit "$PEER_CONTEXTS" --n-neg "$N_NEG" --threads 2 > "$work/peer.json"
else
  echo "peer missing: llama_cpp not importable by $PYTHON; afkit's figures only" >&2
fi

$PYTHON - "$work" "$N_NEG" <<'PY'
import json, os, sys
w = sys.argv[1]
a, s = (json.load(open(f"{w}/{n}.json")) for n in ("afkit_all", "afkit_subset"))
p = json.load(open(f"{w}/peer.json")) if os.path.exists(f"{w}/peer.json") else None
def show(name, d, eps_key, tps_key, secs):
    print(f"{name:<34} {d['contexts']:>4} ctx {d['endings']:>6} endings {secs:8.1f} s "
          f"{d[eps_key]:7.2f} endings/s {d[tps_key]:7.1f} tokens/s")
show("afkit sampling (all contexts)", a, "sampling_endings_per_second", "sampling_tokens_per_second", a["sampling_seconds"])
print(f"{'afkit full generate (all)':<34} {a['contexts']:>4} ctx {a['endings']:>6} endings {a['total_seconds']:8.1f} s {a['endings_per_second']:7.2f} endings/s")
show("afkit sampling (peer's contexts)", s, "sampling_endings_per_second", "sampling_tokens_per_second", s["sampling_seconds"])
print(f"{'afkit full generate (peer ctx)':<34} {s['contexts']:>4} ctx {s['endings']:>6} endings {s['total_seconds']:8.1f} s {s['endings_per_second']:7.2f} endings/s")
if p:
    show("llama-cpp-python (peer)", p, "endings_per_second", "tokens_per_second", p["seconds"])
print(f"decode effective GFLOP/s (afkit, all): {a['decode_gflops']:.1f}")
if p:
    print(f"ratio afkit sampling / peer, endings/s (same contexts): {s['sampling_endings_per_second'] / p['endings_per_second']:.2f}x")
    print(f"ratio afkit full generate / peer, endings/s (same contexts): {s['endings_per_second'] / p['endings_per_second']:.2f}x")
result = {"contexts": s["contexts"], "n_neg": sys.argv[2], "afkit_endings": s["endings"],
          "afkit_sampling_endings_per_s": round(s["sampling_endings_per_second"], 4),
          "afkit_full_endings_per_s": round(s["endings_per_second"], 4)}
if p:
    result.update(peer_contexts=p["contexts"], peer_endings=p["endings"],
                  peer_endings_per_s=round(p["endings_per_second"], 4))
print("RESULT job=generate " + " ".join(f"{k}={v}" for k, v in result.items()))
print(json.dumps({"afkit_all": a, "afkit_subset": s, "peer": p}))
PY
