#!/usr/bin/env bash
# Checks that every header of the library compiles on its own, so that none relies on what
# another header happens to include before it. Each check compiles a translation unit that
# includes just that header, twice (the second include must be a no-op):
#  1. host C++17 (g++ -fsyntax-only -Wall -Wextra -Werror): every header under include/mlakit/
#     except platform/emulated/ (see 3);
#  2. CUDA for sm_90a (nvcc -x cu -c, host and device passes): the headers whose code differs
#     under CUDA, those of kernel/, arch/, platform/ and api/ and mlakit.hpp (core/ and
#     reference/ are plain C++, checked by 1 and 3), except api/instantiate_dispatch.hpp, whose
#     purpose is to compile the whole dispatch table (stage c of .ci/run builds it);
#     MLAKIT_EXTERN_DISPATCH is defined, so api/dispatch.hpp and mlakit.hpp declare the table
#     instead of compiling it;
#  3. the emulated AMD platform (clang++ -fsyntax-only, MLAKIT_EMULATED_AMD and a gfx942
#     target), which compiles the HIP device path as host C++: every header, platform/emulated/
#     included; skipped with a message when no clang++ is found.
#   bash tools/check-headers.sh          (g++, nvcc on PATH or in /usr/local/cuda/bin, clang++)
# Environment: CXX (default g++), MLAKIT_CLANGXX (default clang++-19, else clang++);
# MLAKIT_CHECK_HEADERS_NVCC=0 skips part 2; MLAKIT_JOBS compilers at once (default: the cores).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
cxx=${CXX:-g++}
use_nvcc=${MLAKIT_CHECK_HEADERS_NVCC:-1}
if [ "$use_nvcc" != 0 ] && ! command -v nvcc >/dev/null 2>&1; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
clangxx=${MLAKIT_CLANGXX:-$(command -v clang++-19 || command -v clang++ || true)}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
jobs=${MLAKIT_JOBS:-$(nproc 2>/dev/null || echo 2)}
headers=$(cd include && find mlakit -name '*.hpp' | LC_ALL=C sort)
start=$SECONDS
units=0
running=0

# check LABEL HEADER COMMAND... -- EXT: compiles a unit that includes HEADER twice (a file
# ending in EXT) with COMMAND, the unit's path appended, and with "@OBJ" in COMMAND standing for
# an output path of its own; up to $jobs checks run at once. A failure leaves the first lines of
# its log in a .fail file that finish_pass prints.
check() {
  local label=$1 header=$2 ext=${*: -1}
  shift 2
  local args=("${@:1:$(($# - 2))}")
  units=$((units + 1))
  local unit="$work/u$units$ext"
  printf '#include <%s>\n#include <%s>\n' "$header" "$header" >"$unit"
  args=("${args[@]/@OBJ/$work/u$units.o}")
  (
    if ! "${args[@]}" "$unit" >"$unit.log" 2>&1; then
      { echo "$label: $header does not compile alone:"; head -n 20 "$unit.log"; } >"$unit.fail"
    fi
  ) &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
}
finish_pass() {  # waits for the pass's checks; prints and counts their failures
  wait
  running=0
  local f
  for f in "$work"/*.fail; do
    [ -e "$f" ] || continue
    cat "$f"
    rm -f "$f"
    status=1
  done
}
status=0

n=0
for h in $headers; do
  case $h in mlakit/platform/emulated/*) continue ;; esac
  check "host C++ ($cxx)" "$h" \
    "$cxx" -std=c++17 -fsyntax-only -Wall -Wextra -Werror -I"$root/include" -- .cpp
  n=$((n + 1))
done
finish_pass
echo "host C++ ($cxx -std=c++17): $n headers checked ($((SECONDS - start)) s)"

if [ "$use_nvcc" != 0 ]; then
  command -v nvcc >/dev/null || { echo "check-headers.sh: nvcc not found" >&2; exit 2; }
  t=$SECONDS
  n=0
  for h in $headers; do
    case $h in
      mlakit/platform/emulated/* | mlakit/api/instantiate_dispatch.hpp) continue ;;
      mlakit/kernel/* | mlakit/arch/* | mlakit/platform/* | mlakit/api/* | mlakit/mlakit.hpp) ;;
      *) continue ;;
    esac
    check "CUDA (nvcc, sm_90a)" "$h" \
      nvcc -std=c++17 -arch=sm_90a -x cu -DMLAKIT_EXTERN_DISPATCH=1 -I"$root/include" \
      -c -o @OBJ -- .cu
    n=$((n + 1))
  done
  finish_pass
  echo "CUDA (nvcc -std=c++17 -arch=sm_90a): $n headers checked ($((SECONDS - t)) s)"
fi

if [ -n "$clangxx" ]; then
  t=$SECONDS
  n=0
  for h in $headers; do
    check "emulated AMD ($clangxx)" "$h" \
      "$clangxx" -std=c++17 -fsyntax-only -Wall -Wextra -Werror -DMLAKIT_EMULATED_AMD=1 \
      -D__gfx942__=1 -DMLAKIT_EXTERN_DISPATCH=1 -I"$root/include" -- .cpp
    n=$((n + 1))
  done
  finish_pass
  echo "emulated AMD ($clangxx -std=c++17, gfx942): $n headers checked ($((SECONDS - t)) s)"
else
  echo "emulated AMD: no clang++ found, not checked"
fi
if [ "$status" -eq 0 ]; then
  echo "every header compiles on its own: ok ($((SECONDS - start)) s)"
fi
exit $status
