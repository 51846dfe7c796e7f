#!/usr/bin/env bash
# Builds afkit with the `cuda` feature (candle's CUDA backend) into target/cuda/release/afkit,
# apart from the CPU build in target/release.
#
#   bash scripts/build_cuda.sh                 # cargo build --release --features cuda
#   bash scripts/build_cuda.sh cargo clippy --all-targets --features cuda -- -D warnings
#
# With arguments, it runs them instead, in the same environment.
#
# Toolkit: the one whose nvcc is on PATH or under $CUDA_HOME. Where there is none, NVIDIA's
# toolkit pieces for CUDA 13.0 (nvcc, runtime, NVRTC, cuBLAS, cuRAND, CCCL headers: about 0.7 GB
# to download, 1.2 GB installed) are installed with pip into $AFKIT_HOME/cuda-13.0 (default
# ~/.cache/afkit). 13.0 is the oldest CUDA whose PyPI wheels include nvcc itself (CUDA 12's
# ship ptxas only), so it runs on the widest range of drivers that such a build can. The binary finds the toolkit's libraries through its rpath, and the driver's
# libcuda.so.1 where the NVIDIA driver installed it. CUDA 13 runs on NVIDIA drivers of release
# 580 or newer; with an older driver, install the toolkit that matches it and put its nvcc on
# PATH.
#
# CUDA_COMPUTE_CAP: the GPU's compute capability times ten (90 for H100 and H200, 80 for A100).
# Read from nvidia-smi when unset; 90 where there is no GPU to ask.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_WHEELS=(
  nvidia-cuda-nvcc==13.0.88
  nvidia-nvvm==13.0.88
  nvidia-cuda-crt==13.0.88
  nvidia-cuda-runtime==13.0.96
  nvidia-cuda-nvrtc==13.0.88
  nvidia-cuda-cccl==13.0.85
  nvidia-cublas==13.0.2.14
  nvidia-curand==10.4.0.35
)

# Installs the wheels once; prints the toolkit root.
wheel_toolkit() {
  local home="${AFKIT_HOME:-$HOME/.cache/afkit}/cuda-13.0"
  local root="$home/nvidia/cu13"
  if [ ! -e "$home/.complete" ]; then
    echo "no nvcc on PATH: installing CUDA 13.0 from PyPI into $home" >&2
    python3 -m pip install --quiet --no-deps --target "$home" "${CUDA_WHEELS[@]}" >&2
    # The wheels ship versioned libraries (libcublas.so.13); the linker asks for libcublas.so.
    for lib in "$root"/lib/lib*.so.*; do
      ln -sf "$(basename "$lib")" "$root/lib/$(basename "$lib" | sed 's/\.so\..*/.so/')"
    done
    touch "$home/.complete"
  fi
  echo "$root"
}

# Where the toolkit has no stub of the driver library to link against (the wheels have none),
# one is made in $1 as toolkits make theirs: every function cuda.h declares (current and legacy
# versions), empty, under the driver's soname. At run time the loader binds the driver's real
# libcuda.so.1 instead.
driver_stub() {
  local stubs="$1"
  for dir in lib64/stubs lib/stubs targets/x86_64-linux/lib/stubs; do
    [ -e "$root/$dir/libcuda.so" ] && return
  done
  mkdir -p "$stubs"
  for internal in "" -D__CUDA_API_VERSION_INTERNAL; do
    cc -E -P $internal -I"$root/include" "$root/include/cuda.h"
  done |
    grep -oE '\bcu[A-Za-z0-9_]+ *\(' | tr -d ' (' | sort -u |
    sed 's/.*/void &(void) {}/' >"$stubs/libcuda_stub.c"
  cc -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$stubs/libcuda.so" "$stubs/libcuda_stub.c"
  RUSTFLAGS="$RUSTFLAGS -L native=$stubs"
}

if command -v nvcc >/dev/null 2>&1; then
  root="$(dirname "$(dirname "$(command -v nvcc)")")"
elif [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then
  root="$CUDA_HOME"
else
  root="$(wheel_toolkit)"
fi
libdir="$root/lib64"
[ -d "$libdir" ] || libdir="$root/lib"
export CARGO_TARGET_DIR="$PWD/target/cuda"
export RUSTFLAGS="${RUSTFLAGS:-} -C link-arg=-Wl,-rpath,$libdir"
driver_stub "$CARGO_TARGET_DIR/stubs"
export CUDA_HOME="$root" CUDA_PATH="$root" CUDA_ROOT="$root" NVCC="$root/bin/nvcc"
export PATH="$root/bin:$PATH"
if [ -z "${CUDA_COMPUTE_CAP:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    CUDA_COMPUTE_CAP="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d '.')"
  else
    CUDA_COMPUTE_CAP=90
    echo "no GPU to ask for its compute capability: building for 9.0 (H100/H200; set CUDA_COMPUTE_CAP)" >&2
  fi
fi
export CUDA_COMPUTE_CAP
echo "CUDA toolkit: $root ($("$NVCC" --version | tail -1)); compute capability $CUDA_COMPUTE_CAP" >&2

if [ $# -eq 0 ]; then
  set -- cargo build --release --locked --features cuda
fi
"$@"
