#!/usr/bin/env bash
# The default recipe's generation on a real inference engine against afkit's local backend, on the
# same contexts: llama.cpp's `llama-server`, built from the llama.cpp sources that PyPI's source
# release of llama-cpp-python carries, on loopback with continuous batching (`--parallel N`) and
# the project's fold adapters (`lm adapt`'s GGUF LoRA files, loaded unapplied; each request applies
# its context's fold). Prints endings/s of both and, with --audit, the audit of both exports.
#
#   scripts/bench_server.sh [--contexts N] [--n-neg N] [--parallel N] [--seed S] [--audit]
#   scripts/bench_server.sh --build-only        # build llama-server, print its path
#
#   --contexts  ActivityNet contexts from ../shared (test half; default 30)
#   --n-neg     endings per context (default 64, the default recipe's)
#   --parallel  the server's slots, and afkit's requests in flight (default 4)
#   --audit     also filter (the default recipe), assemble and export both projects, and audit
#               the server's export with the local one as its control (`audit --cv 5 --lm
#               smollm2`): each row of both, their difference, and whether it is within the
#               larger standard error
#
# The build: the source release is downloaded from PyPI's simple index (its SHA-256 checked),
# cmake comes from PyPI too when there is none, and only the server target is compiled (about ten
# minutes on 2 cores), once, into $AFKIT_HOME/llama-server-VERSION. A llama-server already on
# PATH is used instead. `cargo test` runs the integration test against it when it is on PATH:
#   PATH=$(scripts/bench_server.sh --build-only | xargs dirname):$PATH bash scripts/test
#
# Both sides run on the same cores: the server with `-t` = the machine's cores, afkit's local
# backend with its rayon pool; each runs alone.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
SHA256=${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}
AFKIT=${AFKIT:-target/release/afkit}
HOME_DIR=${AFKIT_HOME:-$HOME/.cache/afkit}
CONTEXTS=30 N_NEG=64 PARALLEL=4 SEED=0 AUDIT=0 BUILD_ONLY=0
while [ $# -gt 0 ]; do
  case $1 in
    --contexts) CONTEXTS=$2; shift 2 ;;
    --n-neg) N_NEG=$2; shift 2 ;;
    --parallel) PARALLEL=$2; shift 2 ;;
    --seed) SEED=$2; shift 2 ;;
    --audit) AUDIT=1; shift ;;
    --build-only) BUILD_ONLY=1; shift ;;
    *) echo "unknown argument $1 (see the top of $0)" >&2; exit 2 ;;
  esac
done

# Prints the path of a llama-server binary, building it first where needed.
llama_server() {
  if command -v llama-server >/dev/null 2>&1; then
    command -v llama-server
    return
  fi
  local dest="$HOME_DIR/llama-server-$VERSION"
  if [ ! -x "$dest/bin/llama-server" ]; then
    mkdir -p "$dest/src"
    local tarball="$dest/llama_cpp_python-$VERSION.tar.gz"
    if [ ! -f "$tarball" ]; then
      echo "downloading llama-cpp-python $VERSION's source release from PyPI" >&2
      python3 - "$VERSION" "$tarball.partial" <<'PY'
import json, sys, urllib.request
version, out = sys.argv[1:]
req = urllib.request.Request("https://pypi.org/simple/llama-cpp-python/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
name = f"llama_cpp_python-{version}.tar.gz"
url = next(f["url"] for f in files if f["filename"] == name)
urllib.request.urlretrieve(url, out)
PY
      echo "$SHA256  $tarball.partial" | sha256sum -c --quiet - ||
        { echo "the download's SHA-256 is not $SHA256" >&2; exit 1; }
      mv "$tarball.partial" "$tarball"
    fi
    tar xzf "$tarball" -C "$dest/src" --strip-components=1
    local cmake=cmake
    if ! command -v cmake >/dev/null 2>&1; then
      echo "no cmake on PATH: installing it from PyPI into $dest/venv" >&2
      python3 -m venv "$dest/venv" && "$dest/venv/bin/pip" install -q cmake
      cmake="$dest/venv/bin/cmake"
    fi
    echo "building llama-server (once; about ten minutes on 2 cores)" >&2
    "$cmake" -S "$dest/src/vendor/llama.cpp" -B "$dest/build" -DCMAKE_BUILD_TYPE=Release \
      -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_BUILD_SERVER=ON -DBUILD_SHARED_LIBS=OFF >"$dest/cmake.log" 2>&1 ||
      { tail -20 "$dest/cmake.log" >&2; exit 1; }
    "$cmake" --build "$dest/build" --target llama-server -j "$(nproc)" >"$dest/build.log" 2>&1 ||
      { tail -20 "$dest/build.log" >&2; exit 1; }
    mkdir -p "$dest/bin"
    cp "$dest/build/bin/llama-server" "$dest/bin/llama-server"
  fi
  echo "$dest/bin/llama-server"
}

SERVER=$(llama_server)
if [ "$BUILD_ONLY" = 1 ]; then
  echo "$SERVER"
  exit 0
fi

export AFKIT_NO_PROGRESS=1
work=$(mktemp -d)
server_pid=
cleanup() {
  [ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

MODEL=$($AFKIT models fetch smollm2 | sed 's/^SmolLm2: //')/SmolLM2-135M-Instruct.Q4_1.gguf
P="$work/base.sqlite"
python3 scripts/activitynet_subset.py ../shared/data/activitynet-captions/train.json --half test \
  --pairs $((CONTEXTS * 5 / 4 + 10)) --seed "$SEED" > "$work/captions.json"
$AFKIT init "$P" >/dev/null
$AFKIT ingest "$P" --format activitynet "$work/captions.json" >/dev/null
echo "lm adapt (the default recipe's fold adapters)" >&2
$AFKIT lm adapt "$P" --model "$MODEL" --seed "$SEED" >/dev/null
cp "$P" "$work/local.sqlite"
cp "$P" "$work/server.sqlite"
ln -s "$work/base.adapters" "$work/local.adapters"
ln -s "$work/base.adapters" "$work/server.adapters"

# llama.cpp's server holds every fold's adapter unapplied, in fold order.
# One --lora with the files comma-separated (a repeated flag keeps only the last), in fold order.
LORAS=$(ls "$work"/base.adapters/*.lora.gguf | sort | paste -sd,)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
echo "starting $SERVER on 127.0.0.1:$PORT, $PARALLEL slots, adapters $LORAS" >&2
"$SERVER" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --parallel "$PARALLEL" --cont-batching \
  -t "$(nproc)" -c $((PARALLEL * 1024)) --lora-init-without-apply --lora "$LORAS" \
  >"$work/server.log" 2>&1 &
server_pid=$!
for _ in $(seq 240); do
  curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/server.log" >&2; exit 1; }
  sleep 0.5
done

echo "generate --backend openai: $CONTEXTS contexts × $N_NEG, $PARALLEL requests in flight" >&2
$AFKIT generate "$work/server.sqlite" --backend openai --endpoint "http://127.0.0.1:$PORT" \
  --adapter-lora-ids --concurrency "$PARALLEL" --model "$MODEL" --limit "$CONTEXTS" \
  --n-neg "$N_NEG" --seed "$SEED" --json > "$work/server.json"
kill "$server_pid"; wait "$server_pid" 2>/dev/null || true; server_pid=

echo "generate (local backend): the same contexts" >&2
$AFKIT generate "$work/local.sqlite" --model "$MODEL" --limit "$CONTEXTS" --n-neg "$N_NEG" \
  --seed "$SEED" --json > "$work/local.json"

if [ "$AUDIT" = 1 ]; then
  for p in local server; do
    echo "filter, assemble and export the $p pools" >&2
    $AFKIT filter "$work/$p.sqlite" --seed "$SEED" >/dev/null
    $AFKIT assemble "$work/$p.sqlite" --unverified --seed "$SEED" >/dev/null
    $AFKIT export "$work/$p.sqlite" --out "$work/$p-ds" --negatives adversarial --seed "$SEED" \
      --with-test-labels >/dev/null
  done
  echo "audit of the server's export, the local export as its control" >&2
  $AFKIT audit "$work/server-ds" --cv 5 --seed "$SEED" --control "$work/local-ds" --lm smollm2 \
    --json > "$work/audit.json"
fi

python3 - "$work" "$AUDIT" "$SERVER" "$PARALLEL" <<'PY'
import json, sys
w, audit, server, parallel = sys.argv[1], sys.argv[2] == "1", sys.argv[3], sys.argv[4]
s, l = (json.load(open(f"{w}/{n}.json")) for n in ("server", "local"))
print(f"{'run':<44} {'ctx':>4} {'endings':>7} {'total s':>8} {'endings/s':>9} {'feature s':>9}")
for name, d in ((f"llama-server, {parallel} slots, fold adapters", s), ("afkit local backend", l)):
    print(f"{name:<44} {d['contexts']:>4} {d['endings']:>7} {d['total_seconds']:>8.1f} "
          f"{d['endings_per_second']:>9.2f} {d['feature_seconds']:>9.1f}")
print(f"server / local, endings per second end to end: "
      f"{s['endings_per_second'] / l['endings_per_second']:.2f}x")
print(f"server: {server}; retries {s.get('server_retries')}")
if audit:
    a = json.load(open(f"{w}/audit.json"))
    print(f"{a['cv']['questions']} questions, {a['cv']['folds']} folds by video")
    print(f"{'row':<24} {'server pools':>14} {'local pools':>14} {'diff':>6}  within the larger se")
    for row in a["summary"]:
        c = row.get("control")
        if not c:
            continue
        diff = row["mean"] - c["mean"]
        within = abs(diff) <= max(row["se"], c["se"])
        print(f"{row['name']:<24} {row['mean']:.3f} ± {row['se']:.3f} {c['mean']:.3f} ± {c['se']:.3f} "
              f"{diff * 100:+6.1f}  {'yes' if within else 'no'}")
PY
