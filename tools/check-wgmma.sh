#!/usr/bin/env bash
# Checks that ptxas keeps the wgmma pipelines of the Hopper mainloops (warp-specialized 64-row,
# keys-as-M 16-, 32- and 64-row) asynchronous, two ways:
#  1. compiles their kernels (decode_kernel_split_o for three KV paths, decode_kernel_kt for two
#     each of its 16-, 32- and 64-row policies of e4m3fn KV and its 16- and 32-row 16-bit
#     forms) to
#     sm_90a machine code and counts, in the disassembly, the HGMMA instructions and the
#     WARPGROUP.DEPBAR waits. The sources wait 8 (split-O), 15 (kt, 16 and 32 rows), 10 (kt, 16-bit) and 24 (kt,
#     64 rows) times per kernel
#     (docs/design.md, "Hopper mainloops"); ptxas serialises a
#     pipeline it cannot prove safe by adding a wait after every HGMMA, without always printing
#     its C7515 note, so the count is the check;
#  2. compiles decode()'s whole dispatch table for sm_90a and fails on any ptxas C7515 or
#     C7520 note ("wgmma serialized") and on any C7519 note (a warpgroup.arrive ptxas injected:
#     every wgmma.fence the mainloops need is in their source).
#   bash tools/check-wgmma.sh            (nvcc on PATH or in /usr/local/cuda/bin; needs pip for the
#                                        disassembler wheel, downloaded once, not installed)
# Environment: MLAKIT_TOOLS_DIR (default /tmp/mlakit-tools), MLAKIT_MAX_WAITS (default 8).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
tools=${MLAKIT_TOOLS_DIR:-/tmp/mlakit-tools}
max_waits=${MLAKIT_MAX_WAITS:-8}
if ! command -v nvcc >/dev/null 2>&1; then export PATH=/usr/local/cuda/bin:$PATH; fi
command -v nvcc >/dev/null || { echo "check-wgmma.sh: nvcc not found" >&2; exit 2; }

nvdisasm=$(command -v nvdisasm || true)
if [ -z "$nvdisasm" ]; then
  nvdisasm=$(find "$tools/nvdisasm" -name nvdisasm -type f 2>/dev/null | head -n 1 || true)
fi
if [ -z "$nvdisasm" ]; then
  mkdir -p "$tools/nvdisasm"
  python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$tools/nvdisasm" \
    nvidia-cuda-nvdisasm
  (cd "$tools/nvdisasm" && python3 -m zipfile -e nvidia_cuda_nvdisasm-*.whl .)
  nvdisasm=$(find "$tools/nvdisasm" -name nvdisasm -type f | head -n 1)
  chmod +x "$nvdisasm"
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0
# check KERNEL POLICY MAX_WAITS PROBLEM: compiles KERNEL<DecodeTraits<Problem<PROBLEM>, POLICY>>
# for sm_90a and counts its HGMMA and WARPGROUP.DEPBAR instructions.
check() {
  local kernel=$1 policy=$2 max=$3 problem=$4
  cat >"$work/k.cu" <<CU
#include <mlakit/kernel/decode_kt_sm90.hpp>
#include <mlakit/kernel/decode_split_o_sm90.hpp>
namespace mlakit::detail {
template __global__ void ${kernel}<DecodeTraits<Problem<${problem}>, ${policy}>>(const KernelArgs);
}
CU
  nvcc -std=c++17 -arch=sm_90a -DMLAKIT_BACKEND_CUDA=1 -I"$root/include" \
    -cubin "$work/k.cu" -o "$work/k.cubin" >"$work/nvcc.log" 2>&1 || { cat "$work/nvcc.log"; exit 1; }
  "$nvdisasm" "$work/k.cubin" >"$work/k.sass"
  local hgmma waits verdict=ok
  hgmma=$(grep -c 'HGMMA' "$work/k.sass" || true)
  waits=$(grep -c 'WARPGROUP.DEPBAR' "$work/k.sass" || true)
  if [ "$hgmma" -eq 0 ] || [ "$waits" -gt "$max" ]; then
    verdict="SERIALISED (more than $max waits)"
    status=1
  fi
  printf '%s<%s> (policy %s): %3d HGMMA, %3d WARPGROUP.DEPBAR: %s\n' "$kernel" "$problem" \
    "$policy" "$hgmma" "$waits" "$verdict"
}
# KERNEL POLICY WAITS PROBLEM, one kernel per line. The waits each source has by design:
#  - decode_kernel_split_o: max_waits (8);
#  - decode_kernel_kt, 16 and 32 rows of e4m3fn KV: 68 HGMMA per tile in 17 commit groups, 15;
#  - decode_kernel_kt, 16 and 32 rows of 16-bit KV of the Q type: 36 S^T HGMMA in one group, 32
#    P V HGMMA in 8 (one per 64-dim block, waited for one by one to release the ring's chunks),
#    10;
#  - decode_kernel_kt, 64 rows: per pair 36 S^T HGMMA in 18 groups and 2 x 16 P V HGMMA in 8, 24.
while read -r kernel policy waits problem; do
  check "$kernel" "$policy" "$waits" "$problem" </dev/null
done <<LIST
decode_kernel_split_o 2 $max_waits bf16_t, bf16_t, 16, 8, Causal::on
decode_kernel_split_o 2 $max_waits bf16_t, fp8_e4m3fn_t, 16, 8, Causal::on
decode_kernel_split_o 2 $max_waits fp16_t, kv_any_t
decode_kernel_kt 0 15 bf16_t, fp8_e4m3fn_t, 16, 1, Causal::on
decode_kernel_kt 0 15 fp16_t, fp8_e4m3fn_t
decode_kernel_kt 1 15 bf16_t, fp8_e4m3fn_t, 16, 2, Causal::on
decode_kernel_kt 1 15 fp16_t, fp8_e4m3fn_t
decode_kernel_kt 0 10 bf16_t, bf16_t, 16, 1, Causal::on
decode_kernel_kt 0 10 fp16_t, fp16_t
decode_kernel_kt 1 10 bf16_t, bf16_t, 16, 2, Causal::on
decode_kernel_kt 1 10 fp16_t, fp16_t
decode_kernel_kt 2 24 bf16_t, fp8_e4m3fn_t, 16, 8, Causal::on
decode_kernel_kt 2 24 fp16_t, fp8_e4m3fn_t
LIST

printf '#include <mlakit/api/instantiate_dispatch.hpp>\n' >"$work/table.cu"
nvcc -std=c++17 -arch=sm_90a -DMLAKIT_BACKEND_CUDA=1 -I"$root/include" -c "$work/table.cu" \
  -o "$work/table.o" -Xptxas -v >"$work/table.log" 2>&1 || { cat "$work/table.log"; exit 1; }
notes=$(grep -cE 'C7515|C7519|C7520' "$work/table.log" || true)
kernels=$(grep -c 'Compiling entry function' "$work/table.log" || true)
if [ "$notes" -ne 0 ]; then
  grep -E 'C7515|C7519|C7520' "$work/table.log" | head -n 5
  echo "dispatch table, sm_90a: $notes ptxas C7515 / C7519 / C7520 note(s) in $kernels kernels: FAILED"
  status=1
else
  echo "dispatch table, sm_90a: no ptxas C7515, C7519 or C7520 note in $kernels kernels: ok"
fi
exit $status
