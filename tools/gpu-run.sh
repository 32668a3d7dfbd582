#!/usr/bin/env bash
# Runs ON the GPU machine, from the repository root: configures and builds the CUDA backend
# (tests + benchmarks, sm_90a) against the Catch2 / Google Benchmark copies in .deps/, then
# runs the command given as arguments.
#   tools/gpu-run.sh build/test/mlakit_gpu_tests
#   tools/gpu-run.sh ctest --test-dir build --output-on-failure
#   tools/gpu-run.sh build/bench/mlakit_bench --benchmark_format=json
# .deps/ is git-ignored: an install prefix holding Catch2 v2 and Google Benchmark (headers,
# CMake package files, libraries under lib/x86_64-linux-gnu), for example the files of Debian
# 12's catch2 and libbenchmark-dev packages, copied along with the working tree to a GPU
# machine that cannot install packages itself.
# Environment: MLAKIT_BUILD_DIR (default build), MLAKIT_JOBS (default: all cores),
# MLAKIT_CUDA_ARCHS (default 90a), MLAKIT_GPU_CMAKE_ARGS (extra configure arguments).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
build=${MLAKIT_BUILD_DIR:-build}

if [ ! -d "$root/.deps" ]; then
  echo "gpu-run.sh: $root/.deps is missing (a prefix with Catch2 and Google Benchmark: see the header)" >&2
  exit 2
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi

t0=$SECONDS
# shellcheck disable=SC2086  # MLAKIT_GPU_CMAKE_ARGS is a list of arguments
cmake -S . -B "$build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release \
  -DMLAKIT_BACKEND=CUDA \
  -DMLAKIT_CUDA_ARCHS="${MLAKIT_CUDA_ARCHS:-90a}" \
  -DCMAKE_PREFIX_PATH="$root/.deps" \
  -DMLAKIT_BUILD_BENCH=ON \
  ${MLAKIT_GPU_CMAKE_ARGS:-}
cmake --build "$build" -j "${MLAKIT_JOBS:-$(nproc)}"
echo "gpu-run.sh: configure + build took $((SECONDS - t0)) s" >&2

export LD_LIBRARY_PATH="$root/.deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ $# -gt 0 ]; then
  exec "$@"
fi
