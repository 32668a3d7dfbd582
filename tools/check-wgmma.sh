#!/usr/bin/env bash
# Checks that ptxas keeps the wgmma pipelines of the Hopper mainloops (warp-specialized 64-row,
# keys-as-M 16-, 32- and 64-row) asynchronous. It takes decode()'s whole dispatch table for
# sm_90a as a cubin (no host code), compiled here or read out of an object a build made, and
#  1. counts, in the disassembly of chosen kernels of that table (decode_kernel_split_o for
#     three KV paths, decode_kernel_kt for two each of its 16-, 32- and 64-row policies of
#     e4m3fn KV and its 16- and 32-row 16-bit forms), the HGMMA instructions and the
#     WARPGROUP.DEPBAR waits. The sources wait 8 (split-O), 15 (kt, 16 and 32 rows), 10 (kt,
#     16-bit) and 24 (kt, 64 rows) times per kernel (docs/design.md, "Hopper mainloops"); ptxas
#     serialises a pipeline it cannot prove safe by adding a wait after every HGMMA, without
#     always printing its C7515 note, so the count is the check;
#  2. fails on any ptxas note that reports a serialised or patched wgmma pipeline (C7511 and
#     C7515 "wgmma serialized", C7517 "warpgroup.wait is injected", C7519 "warpgroup.arrive is
#     injected", C7520): every wgmma.fence and wait the mainloops need is in their source.
#     ptxas prints these notes without -v, so a build's own output holds them;
#  3. fails on any cp.async copy (LDGSTS) in the table whose 64-bit memory descriptor starts at
#     an odd uniform register: ptxas 13.0 emits that form for an L2-hinted copy into which it
#     folds a uniform shared-memory offset, and the kernel stops with an illegal-instruction
#     error (arch/copy_atom.hpp, copy16_evict_first).
#   bash tools/check-wgmma.sh              compiles the table (nvcc -cubin, one process)
#   bash tools/check-wgmma.sh OBJECT LOG   reads the sm_90a cubin out of OBJECT, an object nvcc
#                                          compiled for sm_90a from a file that includes
#                                          api/instantiate_dispatch.hpp (examples/dispatch_table.cu
#                                          in a CMake build), and ptxas' notes from LOG, the
#                                          output of the Ninja build that compiled it
# Needs nvcc (on PATH or in /usr/local/cuda/bin) to compile, objcopy and zstd to read an
# object (nvcc compresses the fatbin's cubin), pip for the disassembler wheel (downloaded once,
# not installed), c++filt and python3.
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

if [ $# -eq 0 ]; then
  printf '#include <mlakit/api/instantiate_dispatch.hpp>\n' >"$work/table.cu"
  nvcc -std=c++17 -arch=sm_90a -DMLAKIT_BACKEND_CUDA=1 -I"$root/include" -cubin "$work/table.cu" \
    -o "$work/table.cubin" -Xptxas -v >"$work/table.log" 2>&1 || { cat "$work/table.log"; exit 1; }
  source="dispatch table, sm_90a"
elif [ $# -eq 2 ]; then
  [ -f "$1" ] || { echo "check-wgmma.sh: no object $1" >&2; exit 2; }
  [ -f "$2" ] || { echo "check-wgmma.sh: no build log $2" >&2; exit 2; }
  # Ninja (output not a terminal) prints "[k/N] <description> <output>" as a command ends, then
  # that command's output: the notes of OBJECT's compile are the lines after its own status
  # line (other files of the build, tests among them, are not held to this check).
  awk -v obj="$1" '
    /^\[[0-9]+\/[0-9]+\] / {
      last = $NF
      on = length(last) <= length(obj) && substr(obj, length(obj) - length(last) + 1) == last
      if (on) found = 1
      next
    }
    on { print }
    END { exit found ? 0 : 3 }' "$2" >"$work/table.log" || {
    echo "check-wgmma.sh: $2 has no ninja status line for $1 (was it compiled by that build?)" >&2
    exit 2
  }
  objcopy -O binary --only-section=.nv_fatbin "$1" "$work/fatbin"
  # The fatbin: containers (u32 magic 0xBA55ED50, u16 version, u16 header size, u64 size of
  # the entries), each a list of entries (u16 kind, 2 = ELF; u16 version; u32 header size;
  # u64 padded payload size; u32 compressed size, 0 if not compressed; at header offset 28
  # u32 arch). The payload is the cubin, or (nvcc's default in a CMake build) the cubin
  # compressed with zstd.
  python3 - "$work/fatbin" "$work/table.cubin" <<'PY' || exit 2
import struct, subprocess, sys
data = open(sys.argv[1], "rb").read()
cubins = []
at = 0
while at + 16 <= len(data):
    magic, _version, header, size = struct.unpack_from("<IHHQ", data, at)
    if magic != 0xBA55ED50:
        break
    entry, end = at + header, at + header + size
    while entry < end:
        kind, _v, eheader, padded = struct.unpack_from("<HHIQ", data, entry)
        (compressed,) = struct.unpack_from("<I", data, entry + 16)
        (arch,) = struct.unpack_from("<I", data, entry + 28)
        if kind == 2 and arch == 90:
            payload = data[entry + eheader:entry + eheader + padded]
            if payload[:4] == b"\x28\xb5\x2f\xfd":  # zstd frame
                payload = subprocess.run(["zstd", "-d", "-c", "-q"], input=payload[:compressed],
                                         capture_output=True, check=True).stdout
            cubins.append(payload)
        entry += eheader + padded
    at = end
if len(cubins) != 1 or cubins[0][:4] != b"\x7fELF":
    sys.exit("check-wgmma.sh: %s holds %d sm_90a cubins (one expected)" % (sys.argv[1], len(cubins)))
open(sys.argv[2], "wb").write(cubins[0])
PY
  source="dispatch table, sm_90a ($(basename "$1"))"
else
  echo "usage: bash tools/check-wgmma.sh [OBJECT LOG]" >&2
  exit 2
fi
"$nvdisasm" "$work/table.cubin" >"$work/table.sass"
# One line per function of the table: HGMMA (16-bit) plus QGMMA (e4m3) count, WARPGROUP.DEPBAR
# count, mangled name.
awk '
  /^[ \t]*\.section[ \t]+\.text\./ {
    if (name != "") print hgmma, waits, name
    name = $2; sub(/^\.text\./, "", name); sub(/,.*/, "", name); hgmma = 0; waits = 0; next
  }
  /HGMMA|QGMMA/ { hgmma++ }
  /WARPGROUP\.DEPBAR/ { waits++ }
  END { if (name != "") print hgmma, waits, name }' "$work/table.sass" >"$work/counts"
cut -d' ' -f3 "$work/counts" | c++filt >"$work/names"
paste -d' ' "$work/counts" "$work/names" >"$work/functions"

# KERNEL POLICY WAITS PROBLEM, one kernel per line (PROBLEM as Problem<...>'s arguments; the
# kernel is KERNEL<DecodeTraits<Problem<PROBLEM>, POLICY>> with its other arguments defaulted).
# The waits each source has by design:
#  - decode_kernel_split_o: max_waits (8);
#  - decode_kernel_kt, 16 and 32 rows of e4m3fn KV: 68 HGMMA per tile in 17 commit groups, 15;
#  - decode_kernel_kt, 16 and 32 rows of 16-bit KV of the Q type: 36 S^T HGMMA in one group, 32
#    P V HGMMA in 8 (one per 64-dim block, waited for one by one to release the ring's chunks),
#    10;
#  - decode_kernel_kt, 64 rows: per pair 36 S^T HGMMA in 18 groups and 2 x 16 P V HGMMA in 8, 24;
#    in the fp8 matrix form (Compute::fp8_matrix) 36 S^T QGMMA in 5 chains (4 waits), the
#    pair's one wait after S^T, and 16 P V QGMMA in 4 chains (4 waits), 9.
python3 - "$work/functions" "$max_waits" <<'PY' || status=1
import re, sys
LIST = """
decode_kernel_split_o 2 MAXW bf16_t, bf16_t, 16, 8, Causal::on
decode_kernel_split_o 2 MAXW bf16_t, fp8_e4m3fn_t, 16, 8, Causal::on
decode_kernel_split_o 2 MAXW fp16_t, kv_any_t
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
decode_kernel_kt 2 9 bf16_t, fp8_e4m3fn_t, 0, 0, Causal::dynamic, CacheForm::joined, Compute::fp8_matrix
decode_kernel_kt 2 9 fp16_t, fp8_e4m3fn_t, 0, 0, Causal::dynamic, CacheForm::split, Compute::fp8_matrix
""".replace("MAXW", sys.argv[2])
# The demangled form of each function, namespaces and the parameter list dropped.
funcs = {}
for line in open(sys.argv[1]):
    hgmma, waits, _mangled, demangled = line.rstrip("\n").split(" ", 3)
    name = re.sub(r"\(mlakit::detail::KernelArgs\)$", "", demangled)
    name = name.replace("mlakit::detail::", "").replace("mlakit::", "")
    funcs[name] = (int(hgmma), int(waits))
defaults = ["0", "0", "(Causal)2", "(CacheForm)0", "(Compute)0"]
causal = {"Causal::off": "(Causal)0", "Causal::on": "(Causal)1", "Causal::dynamic": "(Causal)2",
          "CacheForm::joined": "(CacheForm)0", "CacheForm::split": "(CacheForm)1",
          "Compute::fp8_matrix": "(Compute)1"}
status = 0
for entry in filter(None, LIST.strip().split("\n")):
    kernel, policy, maxw, problem = entry.split(" ", 3)
    args = [causal.get(a.strip(), a.strip()) for a in problem.split(",")]
    args = args[:2] + (args[2:] + defaults[len(args) - 2:])
    traits = "DecodeTraits<Problem<%s>, %s, false>" % (", ".join(args), policy)
    hits = [v for n, v in funcs.items()
            if n in ("void %s<%s >" % (kernel, traits), "void %s<%s, false>" % (kernel, traits))]
    if len(hits) != 1:
        print("%s<%s> (policy %s): %d functions of the table match: FAILED" % (kernel, problem, policy, len(hits)))
        status = 1
        continue
    hgmma, waits = hits[0]
    verdict = "ok"
    if hgmma == 0 or waits > int(maxw):
        verdict = "SERIALISED (more than %s waits)" % maxw
        status = 1
    print("%s<%s> (policy %s): %3d HGMMA or QGMMA, %3d WARPGROUP.DEPBAR: %s" % (kernel, problem, policy, hgmma, waits, verdict))
sys.exit(status)
PY

# forbid PATTERN FILE PROBLEM OK: fails (printing the first matches) where PATTERN occurs in FILE,
# saying "<count> PROBLEM"; else says OK.
forbid() {
  local n
  n=$(grep -cE "$1" "$2" || true)
  if [ "$n" -ne 0 ]; then
    grep -E "$1" "$2" | head -n 5
    echo "$source: $n $3: FAILED"
    status=1
  else
    echo "$source: $4: ok"
  fi
}
kernels=$(grep -c '^[[:space:]]*\.global[[:space:]]' "$work/table.sass" || true)
notes='C75(11|15|17|19|20)'
forbid "$notes" "$work/table.log" "ptxas C7511 / C7515 / C7517 / C7519 / C7520 note(s)" \
  "no ptxas C7511, C7515, C7517, C7519 or C7520 note ($kernels kernels in the table)"
copies=$(grep -c 'LDGSTS\.' "$work/table.sass" || true)
forbid 'LDGSTS[^;]*desc\[UR[0-9]*[13579]\]' "$work/table.sass" \
  "of $copies LDGSTS name an odd descriptor register" \
  "every one of $copies LDGSTS names an even descriptor register"
exit $status
