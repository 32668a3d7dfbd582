#!/usr/bin/env bash
# Makes sure the Debian packages a task needs are installed, installing the missing ones when
# it can: as root with apt-get, `apt-get update` once and then one `apt-get install`.
# Otherwise it prints the exact command to run and exits with status 2.
#   bash tools/install-deps.sh test      # tools/test.sh: cmake, Ninja, g++, Catch2 v2, clang-19,
#                                        # Boost.Context
#   bash tools/install-deps.sh example   # tools/example.sh: cmake, Ninja, g++
#   bash tools/install-deps.sh ci        # .ci/run: the above, Google Benchmark, hipcc, rocPRIM
# Several sets may be named at once. Nothing is done when everything is present, so the
# scripts call it on every run. On a system without dpkg the package names are printed for
# reference and the build reports what it cannot find.
# nvcc is not a Debian package: the CUDA toolkit is expected in /usr/local/cuda (or on PATH).
set -euo pipefail

packages=()
for set_name in "$@"; do
  case "$set_name" in
    # clang-19 and Boost.Context: the emulated AMD tests (test/emulated/).
    test) packages+=(cmake ninja-build g++ catch2 clang-19 libboost-context-dev) ;;
    example) packages+=(cmake ninja-build g++) ;;
    # hipcc brings clang-15, lld, rocm-device-libs, rocminfo and libamdhip64-dev; zstd reads
    # the compressed cubin of an nvcc object (tools/check-wgmma.sh).
    ci) packages+=(cmake ninja-build g++ catch2 libbenchmark-dev hipcc librocprim-dev python3
                   python3-pip python3-venv clang-19 lld-19 clang-tools-19 libclang-rt-19-dev
                   zstd) ;;
    *)
      echo "install-deps.sh: unknown set '$set_name' (allowed: test, example, ci)" >&2
      exit 2
      ;;
  esac
done
if [ ${#packages[@]} -eq 0 ]; then
  echo "usage: bash tools/install-deps.sh test|example|ci ..." >&2
  exit 2
fi
# One copy of each name, order kept.
mapfile -t packages < <(printf '%s\n' "${packages[@]}" | awk '!seen[$0]++')

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install-deps.sh: no dpkg here; mlakit needs the equivalents of the Debian packages:" \
    "${packages[*]}" >&2
  exit 0
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

command_line="apt-get update && apt-get install -y ${missing[*]}"
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  {
    echo "install-deps.sh: missing Debian packages: ${missing[*]}"
    echo "Install them (as root), then run this script again:"
    echo "  sudo sh -c '$command_line'"
  } >&2
  exit 2
fi

echo "install-deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update
apt-get install -y "${missing[@]}"
