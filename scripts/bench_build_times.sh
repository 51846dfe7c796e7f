#!/usr/bin/env bash
# Times afkit's own crates in the release profile, its dependencies already compiled:
#   1. every afkit crate cleaned and built again (`cargo build --release`);
#   2. for each FILE given, one line appended to it (a public constant), then the build again:
#      what a one-line change in that file costs; the file is restored after.
# Usage: scripts/bench_build_times.sh FILE...   (e.g. a stage's file and an engine file)
# Prints one line per build: what was built and the seconds it took. Runs on a clean work tree.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -z "$(git status --porcelain)" ] || { echo "the work tree has changes: commit them first" >&2; exit 1; }
cargo build --release --locked >/dev/null 2>&1
packages=$(cargo metadata --no-deps --format-version 1 |
  python3 -c 'import json,sys; print(" ".join(p["name"] for p in json.load(sys.stdin)["packages"]))')
for p in $packages; do cargo clean --release -p "$p" >/dev/null 2>&1; done
timed() {
  local start end
  start=$(date +%s.%N)
  cargo build --release --locked >/dev/null 2>&1
  end=$(date +%s.%N)
  python3 -c "print(f'$1 {($end - $start):.0f} s')"
}
timed "afkit's crates, cleaned:"
for file in "$@"; do
  echo "pub const BUILD_TIME_PROBE: u32 = 1;" >> "$file"
  timed "one line added to $file:"
  git checkout -q -- "$file"
done
cargo build --release --locked >/dev/null 2>&1
