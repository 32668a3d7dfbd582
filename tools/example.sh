#!/usr/bin/env bash
# Builds and runs the main example, examples/spec_decode_verify.cu (the README's quick start):
# the speculative-decoding verify shape, checked against the host reference, then timed.
#   bash tools/example.sh
# Backend: CUDA when nvcc is found (on PATH or in /usr/local/cuda/bin), else NONE (host only).
# Without a GPU (no backend, or none at run time) the example says so and runs the host
# reference only. Only the example target is built, tests excluded (a few minutes with CUDA
# on 2 cores).
# Environment: MLAKIT_BACKEND (CUDA, HIP or NONE; HIP also needs CXX=hipcc and
# MLAKIT_HIP_ARCHS), MLAKIT_CUDA_ARCHS (default: the local GPU's, else 90a),
# MLAKIT_BUILD_DIR (default build-example), MLAKIT_JOBS (default: all cores).
# Missing Debian packages (cmake, ninja-build, g++) are installed first when running as root,
# else the exact apt-get command is printed (tools/install-deps.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/install-deps.sh example
build=${MLAKIT_BUILD_DIR:-build-example}

if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
backend=${MLAKIT_BACKEND:-}
if [ -z "$backend" ]; then
  if command -v nvcc >/dev/null 2>&1; then backend=CUDA; else backend=NONE; fi
fi

args=(-DMLAKIT_BACKEND="$backend" -DMLAKIT_BUILD_TESTS=OFF -DMLAKIT_BUILD_EXAMPLES=ON)
if [ "$backend" = CUDA ]; then
  # One arch keeps the build short: the local GPU's (9.0 -> 90a, 8.x -> 80), else 90a.
  archs=${MLAKIT_CUDA_ARCHS:-}
  if [ -z "$archs" ] && command -v nvidia-smi >/dev/null 2>&1; then
    cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .' || true)
    case "$cc" in
      90) archs=90a ;;
      8[0-9]) archs=80 ;;
      [0-9][0-9]*) archs=$cc ;;
    esac
  fi
  args+=(-DMLAKIT_CUDA_ARCHS="${archs:-90a}")
elif [ "$backend" = HIP ] && [ -n "${MLAKIT_HIP_ARCHS:-}" ]; then
  args+=(-DMLAKIT_HIP_ARCHS="$MLAKIT_HIP_ARCHS")
fi

t0=$SECONDS
cmake -S . -B "$build" -G Ninja "${args[@]}"
cmake --build "$build" --target spec_decode_verify -j "${MLAKIT_JOBS:-$(nproc)}"
echo "example.sh: backend $backend, configure + build took $((SECONDS - t0)) s" >&2
exec "$build/examples/spec_decode_verify"
