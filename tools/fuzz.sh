#!/usr/bin/env bash
# Fuzzes the host API (test/fuzz/fuzz_validate.cpp: set_packed_strides, validate,
# workspace_bytes, decode without a backend, the planner's inputs) with clang's libFuzzer,
# AddressSanitizer and UndefinedBehaviorSanitizer, for a bounded time, starting from the
# committed corpus (test/fuzz/corpus/). Fails on any finding: a sanitizer report, a crash, a
# timeout or a failed oracle (the target aborts with the disagreement it found). The input that
# found it is written to build-fuzz/ (crash-*, timeout-*, oom-*); replay it with
#   build-fuzz/fuzz_validate build-fuzz/crash-...
#
#   bash tools/fuzz.sh                 # 60 s (CI stage a2)
#   MLAKIT_FUZZ_SECONDS=600 bash tools/fuzz.sh
# The compiler: $MLAKIT_FUZZ_CXX, else the first of clang++-19 (CI's, Debian packages clang-19
# and libclang-rt-19-dev, in tools/install-deps.sh ci), clang++-14, clang++.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
seconds=${MLAKIT_FUZZ_SECONDS:-60}
cxx=${MLAKIT_FUZZ_CXX:-}
if [ -z "$cxx" ]; then
  for c in clang++-19 clang++-14 clang++; do
    if command -v "$c" >/dev/null 2>&1; then
      cxx=$c
      break
    fi
  done
fi
[ -n "$cxx" ] || { echo "fuzz.sh: no clang++ found (Debian: clang-19 libclang-rt-19-dev)" >&2; exit 1; }
"$cxx" --version | head -n 1

out=build-fuzz
mkdir -p "$out"
# -O1 with debug info: fast enough (about 30000 calls a second) and readable reports.
# -fno-sanitize-recover: the first report ends the run (and fails it).
"$cxx" -std=c++17 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
  -Wall -Wextra -Werror -Iinclude -Itest test/fuzz/fuzz_validate.cpp -o "$out/fuzz_validate"

# Fuzz a copy of the corpus (libFuzzer adds the inputs it finds to its first folder).
rm -rf "$out/corpus"
cp -r test/fuzz/corpus "$out/corpus"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
"$out/fuzz_validate" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus"
echo "fuzz.sh: no finding in ${seconds} s ($(find "$out/corpus" -type f | wc -l) inputs in the corpus)"
