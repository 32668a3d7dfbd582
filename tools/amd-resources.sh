#!/usr/bin/env bash
# AMD compile checks and static costs that need no AMD GPU. Nothing here runs AMD code.
#
#   bash tools/amd-resources.sh check       HIP 7.1 headers: host compile (clang-19) of every
#                                           .cu file, device compile for gfx942 and gfx950
#                                           (clang 22) of every .cu file, -Werror (the dispatch
#                                           table once, in examples/dispatch_table.cu)
#   bash tools/amd-resources.sh table [md]  device assembly of examples/spec_decode_verify.cu
#                                           (the whole decode() dispatch table) for gfx90a and
#                                           gfx942 (clang-19, Debian's HIP 5.2 headers) and for
#                                           gfx942 and gfx950 (clang 22, HIP 7.1 headers), then
#                                           tools/amd-resources.py on them
#   bash tools/amd-resources.sh all [md]    both in one pool of MLAKIT_JOBS compilers, the
#                                           table's clang 22 device code compiled once: table's
#                                           gfx942 and gfx950 assembly (the same flags, -S for -c)
#                                           stands for check's device compiles of
#                                           examples/dispatch_table.cu
#
# Toolchains, all from package registries (Debian 12 has no clang >= 20 and no HIP >= 6):
#   clang-19, lld-19, Debian's HIP 5.2 headers and ROCm 5.2 device libraries (apt: clang-19
#     lld-19 clang-tools-19 libclang-rt-19-dev hipcc librocprim-dev);
#   clang 22 from PyPI's ziglang wheel (`zig clang`), the first clang here that knows gfx950;
#   HIP 7.1 headers and ROCm 7.1 ocml/ockl bitcode from PyPI's triton wheel
#     (triton/backends/amd/{include,lib}).
# The wheels are downloaded once (pip download, no install) and unpacked under
# $MLAKIT_AMD_TOOLS (default build-amd-tools/).
#
# clang 22 needs, for these device libraries: -mcode-object-version=5 (its default, 6, has no
# oclc_abi_version_600.bc here), clang-19's resource directory (the ziglang wheel ships
# clang's headers without the HIP wrapper headers), ld.lld-19 as the device linker (the
# wheel's lld has no AMDGPU target), --no-gpu-bundle-output (no clang-offload-bundler), and
# ISA-version files for gfx942/gfx950 generated as in cmake/mlakit_hip_device_libs.cmake.
# rocPRIM is left out of the HIP 7.1 compiles (MLAKIT_NO_ROCPRIM): Debian's rocPRIM 5.3 does
# not compile against HIP 7 headers (warpSize is no longer a constant expression there).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
mode=${1:-table}
tools=${MLAKIT_AMD_TOOLS:-$root/build-amd-tools}
jobs=${MLAKIT_JOBS:-2}
ziglang_version=0.17.1
triton_version=3.9.0
debian_bitcode=/usr/lib/x86_64-linux-gnu/amdgcn/bitcode
clang19=${CLANG19:-clang++-19}
mkdir -p "$tools"

# ---- toolchains ------------------------------------------------------------------------------
fetch_wheels() {
  if [ ! -x "$tools/ziglang/zig" ] || [ ! -f "$tools/triton/backends/amd/include/hip/hip_version.h" ]; then
    python3 -m pip --version >/dev/null 2>&1 || {
      echo "amd-resources.sh: python3 -m pip is needed (Debian: apt-get install python3-pip)" >&2
      exit 2
    }
    rm -rf "$tools/wheels"
    python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tools/wheels" \
      "ziglang==$ziglang_version" "triton==$triton_version"
    python3 - "$tools" <<'EOF'
import sys, zipfile, glob, os
tools = sys.argv[1]
for whl in glob.glob(os.path.join(tools, "wheels", "*.whl")):
    with zipfile.ZipFile(whl) as z:
        for info in z.infolist():
            n = info.filename
            if n.startswith("ziglang/") or n.startswith("triton/backends/amd/include/") or \
               n in ("triton/backends/amd/lib/ocml.bc", "triton/backends/amd/lib/ockl.bc"):
                z.extract(info, tools)
                mode = (info.external_attr >> 16) & 0o777
                if mode:
                    os.chmod(os.path.join(tools, n), mode)
EOF
    rm -rf "$tools/wheels"
  fi
  zig="$tools/ziglang/zig"
  hip7="$tools/triton/backends/amd"
  grep -E 'define HIP_VERSION_(MAJOR|MINOR) ' "$hip7/include/hip/hip_version.h" | tr '\n' ' '
  echo "($("$zig" clang --version | head -n 1))"
}

isa_file() {  # isa_file DIR ID VALUE: oclc_isa_version_ID.bc defining __oclc_ISA_version
  printf 'target triple = "amdgcn-amd-amdhsa"\n@__oclc_ISA_version = linkonce_odr protected local_unnamed_addr addrspace(4) constant i32 %s, align 4\n' "$3" >"$1/isa_$2.ll"
  "$clang19" -c -emit-llvm -x ir --target=amdgcn-amd-amdhsa -nogpulib "$1/isa_$2.ll" -o "$1/oclc_isa_version_$2.bc"
  rm -f "$1/isa_$2.ll"
}

# Device libraries: Debian's ROCm 5.2 folder plus the gfx942 ISA-version file (for clang-19);
# for clang 22 the ROCm 7.1 ocml/ockl of the triton wheel over Debian's oclc control files.
make_bitcode_dirs() {
  bc5="$tools/bitcode-5.2"
  bc7="$tools/bitcode-7.1"
  rm -rf "$bc5" "$bc7"
  mkdir -p "$bc5" "$bc7" "$tools/bin"
  ln -s "$debian_bitcode"/*.bc "$bc5/"
  ln -s "$debian_bitcode"/*.bc "$bc7/"
  rm -f "$bc7/ocml.bc" "$bc7/ockl.bc"
  ln -s "$hip7/lib/ocml.bc" "$hip7/lib/ockl.bc" "$bc7/"
  isa_file "$bc5" 942 9402
  isa_file "$bc7" 942 9402
  isa_file "$bc7" 950 9500
  # clang looks for the device linker as "lld" (called with -flavor gnu) next to -B.
  ln -sf "$(command -v lld-19)" "$tools/bin/lld"
}

common=(-x hip -std=c++17 -O2 -DNDEBUG -DMLAKIT_BACKEND_HIP=1 -I"$root/include"
  -mllvm -amdgpu-early-inline-all=true -mllvm -amdgpu-function-calls=false
  -Wall -Wextra -Werror)
clang22_flags() {  # device-only flags for clang 22 against HIP 7.1
  echo -mcode-object-version=5 -resource-dir "$("$clang19" -print-resource-dir)" \
    -B"$tools/bin" -isystem "$hip7/include" -D__HIP_PLATFORM_AMD__=1 -DMLAKIT_NO_ROCPRIM \
    --rocm-device-lib-path="$bc7" --cuda-device-only
}

sources() {  # every GPU translation unit of the tree
  ls examples/*.cu test/gpu_*.cu
}

# ---- check: the HIP 7.1 headers, gfx942 and gfx950 ------------------------------------------
# check_commands [no-table-device]: one compile command per line; with no-table-device, not the
# clang 22 device compiles of examples/dispatch_table.cu (table_commands compiles that code).
check_commands() {
  out="$tools/check"
  rm -rf "$out"
  mkdir -p "$out"
  for src in $(sources); do
    base=$(basename "$src" .cu)
    # The dispatch table is compiled once, by examples/dispatch_table.cu; every other file
    # declares it (MLAKIT_EXTERN_DISPATCH), as the CMake builds do.
    ext=-DMLAKIT_EXTERN_DISPATCH=1
    [ "$base" = dispatch_table ] && ext=
    # Host side against HIP 7.1 (hipDeviceProp_t, runtime API), clang-19.
    echo "$clang19 ${common[*]} $ext -I$root/test -isystem $hip7/include -D__HIP_PLATFORM_AMD__=1 -DMLAKIT_NO_ROCPRIM --cuda-host-only --offload-arch=gfx942 -c $src -o $out/$base.host.o"
    [ "$base" = dispatch_table ] && [ "${1:-}" = no-table-device ] && continue
    # Device side against HIP 7.1 and ROCm 7.1 ocml/ockl, clang 22, linked code objects.
    for arch in gfx942 gfx950; do
      echo "$zig clang ${common[*]} $ext -I$root/test $(clang22_flags) --no-gpu-bundle-output --offload-arch=$arch -c $src -o $out/$base.$arch.co"
    done
  done
}

# ---- table: resources of the dispatch table -----------------------------------------------------
table_commands() {
  out="$tools/asm"
  rm -rf "$out"
  mkdir -p "$out"
  src=examples/spec_decode_verify.cu
  echo "$clang19 ${common[*]} -D__HIP_PLATFORM_AMD__=1 --rocm-device-lib-path=$bc5 --cuda-device-only --offload-arch=gfx90a -S $src -o $out/gfx90a.s"
  echo "$clang19 ${common[*]} -D__HIP_PLATFORM_AMD__=1 --rocm-device-lib-path=$bc5 --cuda-device-only --offload-arch=gfx942 -S $src -o $out/gfx942.s"
  echo "$zig clang ${common[*]} $(clang22_flags) --offload-arch=gfx942 -S $src -o $out/gfx942-clang22.s"
  echo "$zig clang ${common[*]} $(clang22_flags) --offload-arch=gfx950 -S $src -o $out/gfx950.s"
}
table_report() {  # table_report [md]: tools/amd-resources.py on table_commands' assembly
  python3 tools/amd-resources.py ${1:+--markdown} gfx90a="$tools/asm/gfx90a.s" \
    gfx942="$tools/asm/gfx942.s" gfx942/clang22="$tools/asm/gfx942-clang22.s" \
    gfx950="$tools/asm/gfx950.s"
}

# run_pool: runs the compile commands on stdin, $jobs at a time; the first failure stops it.
run_pool() {
  xargs -P "$jobs" -I{} sh -c '{} || { echo "FAILED: {}" >&2; exit 255; }'
}
check_summary() {  # check_summary COUNT
  echo "amd-resources.sh check: $1 compiles passed (host: HIP 7.1 headers, clang-19;" \
    "device: gfx942 and gfx950, HIP 7.1 headers and ROCm 7.1 device libraries, clang 22)"
}

check() {
  fetch_wheels
  make_bitcode_dirs
  local cmds
  cmds=$(check_commands)
  printf '%s\n' "$cmds" | run_pool
  check_summary "$(printf '%s\n' "$cmds" | wc -l)"
}

table() {
  fetch_wheels >/dev/null
  make_bitcode_dirs
  table_commands | run_pool
  table_report "${1:-}"
}

all() {
  fetch_wheels
  make_bitcode_dirs
  local cmds tables
  cmds=$(check_commands no-table-device)
  tables=$(table_commands)
  # The four table compiles first: they are the longest, so the pool ends evenly.
  printf '%s\n%s\n' "$tables" "$cmds" | run_pool
  check_summary "$(($(printf '%s\n' "$cmds" | wc -l) + 2))"
  echo "(the clang 22 device code of examples/dispatch_table.cu for gfx942 and gfx950: the" \
    "table's assembly of examples/spec_decode_verify.cu, which compiles the same table)"
  table_report "${1:-}"
}

case "$mode" in
  check) check ;;
  table) table "${2:-}" ;;
  all) all "${2:-}" ;;
  *)
    echo "usage: bash tools/amd-resources.sh check | table [md] | all [md]" >&2
    exit 2
    ;;
esac
