#!/usr/bin/env bash
# The project's test command (the README names it): host-only build + all CTest tests,
# including the AMD path on the emulated AMD device (label amd-emulated, test/emulated/).
#   bash tools/test.sh                      # what a developer runs
#   bash tools/test.sh -DMLAKIT_WERROR=ON   # extra arguments go to the configure step (CI)
# MLAKIT_JOBS sets the build and test parallelism (default 2: the machines here have 2 cores;
# the emulated-AMD tests, most of the test time, leave a core idle in their serial parts).
# Missing Debian packages (cmake, ninja-build, g++, catch2, clang-19, libboost-context-dev) are
# installed first when running as root, else the exact apt-get command is printed
# (tools/install-deps.sh).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash tools/install-deps.sh test
cmake -S . -B build -G Ninja -DMLAKIT_BACKEND=NONE -DMLAKIT_AMD_EMULATION=ON "$@"
cmake --build build -j "${MLAKIT_JOBS:-2}"
ctest --test-dir build --output-on-failure -j "${MLAKIT_JOBS:-2}"
