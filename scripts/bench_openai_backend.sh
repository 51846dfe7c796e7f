#!/usr/bin/env bash
# `afkit generate --backend openai` against llama.cpp's server (llama-cpp-python[server]) on
# loopback vs afkit's own local backend: same model (SmolLM2-135M-Instruct Q4_1), same job
# (ActivityNet contexts from ../shared, N⁻ endings each), 2 threads on each side.
#
#   scripts/bench_openai_backend.sh [CONTEXTS=50] [N_NEG=32] [CONCURRENCY=4]
#
# Needs a release build and $PYTHON (default python3) with llama-cpp-python and its server
# dependencies (uvicorn fastapi sse-starlette starlette-context pydantic-settings).
set -euo pipefail
cd "$(dirname "$0")/.."
CONTEXTS=${1:-50}
N_NEG=${2:-32}
CONCURRENCY=${3:-4}
PYTHON=${PYTHON:-python3}
PORT=${PORT:-8089}
AFKIT=target/release/afkit
export RAYON_NUM_THREADS=2 AFKIT_NO_PROGRESS=1
DATA=../shared/data/activitynet-captions/train.json
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

MODEL=$($AFKIT models fetch smollm2 | sed 's/^SmolLm2: //')/SmolLM2-135M-Instruct.Q4_1.gguf
for p in local server; do
  $AFKIT init "$work/$p.sqlite" >/dev/null
  $AFKIT ingest "$work/$p.sqlite" --format activitynet "$DATA" >/dev/null
done

echo "starting llama.cpp's server on 127.0.0.1:$PORT" >&2
$PYTHON -m llama_cpp.server --model "$MODEL" --n_threads 2 --n_threads_batch 2 \
  --host 127.0.0.1 --port "$PORT" --logits_all true --verbose false >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 120); do
  curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.5
done

echo "afkit generate --backend openai: $CONTEXTS contexts, N-=$N_NEG, concurrency $CONCURRENCY" >&2
$AFKIT generate "$work/server.sqlite" --backend openai --endpoint "http://127.0.0.1:$PORT" \
  --concurrency "$CONCURRENCY" --model "$MODEL" --limit "$CONTEXTS" --n-neg "$N_NEG" --json \
  > "$work/server.json"
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=

echo "afkit generate (local backend): same job" >&2
$AFKIT generate "$work/local.sqlite" --model "$MODEL" --limit "$CONTEXTS" --n-neg "$N_NEG" --json \
  > "$work/local.json"

$PYTHON - "$work" <<'PY'
import json, sys
w = sys.argv[1]
s, l = (json.load(open(f"{w}/{n}.json")) for n in ("server", "local"))
print(f"{'run':<40} {'ctx':>4} {'endings':>7} {'short':>5} {'sampling s':>10} {'sampling end/s':>14} {'total s':>8} {'total end/s':>11}")
for name, d in (("openai backend -> llama.cpp server", s), ("local backend (candle)", l)):
    print(f"{name:<40} {d['contexts']:>4} {d['endings']:>7} {d['shortfall']:>5} {d['sampling_seconds']:>10.1f} "
          f"{d['sampling_endings_per_second']:>14.2f} {d['total_seconds']:>8.1f} {d['endings_per_second']:>11.2f}")
print(f"ratio local / openai backend, sampling endings/s: {l['sampling_endings_per_second'] / s['sampling_endings_per_second']:.2f}x")
print(f"ratio local / openai backend, full generate endings/s: {l['endings_per_second'] / s['endings_per_second']:.2f}x")
print(f"server retries: {s.get('server_retries')}")
print(json.dumps({"openai": s, "local": l}))
PY
