#!/usr/bin/env python3
"""Static cost of mlakit's AMD kernels, read from compiler assembly (no GPU needed).

    tools/amd-resources.py [--markdown] TARGET=FILE.s [TARGET=FILE.s ...]

Each FILE.s is the device assembly of one translation unit for one gfx target (clang -x hip
--cuda-device-only -S; tools/amd-resources.sh makes them). TARGET is the gfx name, optionally
followed by /LABEL to tell compilers apart (gfx942/clang22). Per kernel and target it
prints: VGPRs (architectural: the metadata's .vgpr_count minus .agpr_count), AGPRs, SGPRs,
VGPR and SGPR spills, scratch bytes per lane, LDS (static + the dynamic size the decode
kernel is launched with, from the HIP row of arch/tile_policy.hpp), waves per SIMD and what
limits them, and for the decode kernels the MFMA, global-load and LDS instructions one wave
executes per KV tile.

Registers, spills and scratch come from the code object metadata (.amdgpu_metadata). Waves
per SIMD: a SIMD has 512 registers per lane shared by VGPRs and AGPRs, allocated as
alignTo(alignTo(vgpr, 4) + agpr, 8); LDS is per CU (64 KiB on gfx90a/gfx942, 160 KiB on
gfx950) and a workgroup's waves spread over the CU's 4 SIMDs; at most 8 waves per SIMD.

Per-KV-tile counts walk LLVM's loop comments in the assembly: the tile loop is the loop
holding the most MFMA instructions of its own; an inner loop counts with its trip count,
read from its scalar counter (init, step, exit compare), or for a per-lane loop from its
vector counter's step and bound (marked '~': lanes may differ by one iteration); a loop
whose trip count is not found counts once and marks the count with '+'.
"""
import math
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# ---- the HIP tile policy and the decode kernel's LDS layout ---------------------------------
HEAD_QK, HEAD_V = 576, 512


def hip_policies():
    """The HIP kPolicies table of arch/tile_policy.hpp as dicts (with "mainloop"): each policy
    is a constexpr function that starts from another policy or a default TilePolicy and sets
    fields by name (p.rows = 16;)."""
    text = (ROOT / "include/mlakit/arch/tile_policy.hpp").read_text()
    # The AMD table is the branch of the file's platform #if whose kPolicies lists cdna
    # policies (the other branch holds the NVIDIA table).
    block = ""
    for m in re.finditer(r"#if defined\(\w+\)(.*?)#else", text, re.S):
        if re.search(r"kPolicies\[\] = \{\s*cdna_", m.group(1)):
            block = m.group(1)
    funcs = dict(re.findall(r"constexpr TilePolicy (\w+)\(\) \{(.*?)\n\}", block, re.S))

    def fields(name):
        body = funcs[name]
        base = re.match(r"\s*TilePolicy p = (\w+)\(\);", body)
        pol = fields(base.group(1)) if base else {}
        for key, value in re.findall(r"p\.(\w+) = ([^;]+);", body):
            pol[key] = value.split("::")[-1] if "::" in value else int(value)
        return pol

    table = re.search(r"kPolicies\[\] = \{(.*?)\};", block, re.S)
    return [fields(n) for n in re.findall(r"(\w+)\(\)", table.group(1) if table else "")]


def decode_lds_bytes(pol):
    """Dynamic LDS of the decode kernel on AMD without the self-plan bytes. cdna
    (kernel/decode_cdna.hpp): one KV tile in the compute type and, at 128 rows, 10 of Q's 36
    k-steps per wave. warp_mma (decode_kernel.hpp,
    DecodeTraits): Q tile, `stages` KV tiles, P tile, row max / sum exchange."""
    if pol.get("mainloop") == "cdna":  # cdna_smem_bytes(): the tile, the 128-row form's Q k-steps
        q_steps = 10 if pol["rows"] == 128 else 0
        return pol["kv_tile"] * HEAD_QK * 2 + (pol["threads"] // 64) * q_steps * 64 * 8
    col_groups = (pol["threads"] // 64) // (pol["rows"] // 16)
    q = pol["rows"] * HEAD_QK * 2
    kv = pol["stages"] * pol["kv_tile"] * HEAD_QK * 2
    p = pol["rows"] * pol["kv_tile"] * 2
    red = 2 * col_groups * pol["rows"] * 4
    return q + kv + p + red


LDS_PER_CU = {"gfx90a": 65536, "gfx940": 65536, "gfx942": 65536, "gfx950": 163840}


def lds_per_cu(target):  # "gfx942/clang22" -> gfx942's
    return LDS_PER_CU.get(target.split("/")[0], 65536)


# ---- assembly parsing ---------------------------------------------------------------------------
def parse_metadata(text):
    m = re.search(r"\.amdgpu_metadata(.*?)\.end_amdgpu_metadata", text, re.S)
    kernels, cur = [], None
    for line in (m.group(1) if m else "").splitlines():
        k = re.match(r"^  - \.(\w+):\s*(.*)$", line)
        if k:
            cur = {}
            kernels.append(cur)
            cur[k.group(1)] = k.group(2).strip()
            continue
        k = re.match(r"^    \.(\w+):\s*(.*)$", line)
        if k and cur is not None:
            cur[k.group(1)] = k.group(2).strip()
    return [k for k in kernels if ".name" in k or "name" in k]


def function_body(text, name):
    start = re.search(r"^" + re.escape(name) + r":", text, re.M)
    if not start:
        return []
    end = text.find(".Lfunc_end", start.end())
    return text[start.end():end].splitlines()


def parse_imm(s):
    s = s.strip()
    return int(s, 16) if s.lower().startswith(("0x", "-0x")) else int(s)


def classify(op):
    if op.startswith("v_mfma"):
        return "mfma"
    if op.startswith(("global_load", "buffer_load", "flat_load")):
        return "gload"
    if op.startswith(("ds_read", "ds_load")):
        return "ds_read"
    if op.startswith(("ds_write", "ds_store")):
        return "ds_write"
    if op.startswith("ds_"):
        return "ds_other"
    return None


KINDS = ["mfma", "gload", "ds_read", "ds_write", "ds_other"]


def loops_of(body):
    """Blocks -> their innermost loop; per loop: parent, own instruction counts, lines."""
    loops = {}  # header -> {"parent", "counts", "lines", "children"}

    def new_loop(h):
        return loops.setdefault(h, {"parent": None, "counts": dict.fromkeys(KINDS, 0),
                                    "lines": [], "children": []})

    cur = None
    i = 0
    while i < len(body):
        line = body[i]
        lab = re.match(r"^(\.LBB\d+_\d+|; %bb\.\d+):", line)
        if lab:
            block = lab.group(1).replace(".LBB", "BB").replace("; %bb.", "bb")
            comments = [line]
            j = i + 1
            while j < len(body) and re.match(r"^\s+;", body[j]):
                comments.append(body[j])
                j += 1
            c = "\n".join(comments)
            parents = re.findall(r"Parent Loop (BB\d+_\d+) Depth=(\d+)", c)
            if "Loop Header: Depth=" in c:
                cur = block
                parent = parents[-1][0] if parents else None
                new_loop(cur)["parent"] = parent
                if parent is not None:
                    new_loop(parent)["children"].append(cur)
            else:
                h = re.search(r"in Loop: Header=(BB\d+_\d+) Depth=", c)
                cur = h.group(1) if h else None
                if cur is not None:
                    new_loop(cur)
            i = j
            continue
        s = line.strip()
        if cur is not None and s and not s.startswith((";", ".")):
            loops[cur]["lines"].append(s)
            kind = classify(s.split()[0])
            if kind:
                loops[cur]["counts"][kind] += 1
        i += 1
    return loops


CMP = {"eq": lambda a, b: a == b, "lg": lambda a, b: a != b, "gt": lambda a, b: a > b,
       "ge": lambda a, b: a >= b, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b}


def scalar_trip(body, header, lines):
    """Trip count from `s_add sX, sX, C` ... `s_cmp sX, N` ... `s_cbranch_scc header`."""
    for k, s in enumerate(lines):
        m = re.match(r"s_cbranch_scc([01]) \.L(" + header + r")$", s)
        if not m:
            continue
        taken_on = int(m.group(1))
        cmp = None
        for t in range(k - 1, -1, -1):
            cmp = re.match(r"s_cmp(k?)_(eq|lg|gt|ge|lt|le)_([ui]32) (s\d+), (\S+)$", lines[t])
            if cmp:
                break
        if not cmp:
            return None
        reg, bound = cmp.group(4), cmp.group(5)
        try:
            n = parse_imm(bound)
        except ValueError:
            return None
        if cmp.group(1) and cmp.group(3) == "i32" and n >= 0x8000:
            n -= 0x10000
        step = None
        for t in range(0, k):
            a = re.match(r"s_add_[iu]32 " + reg + r", " + reg + r", (\S+)$", lines[t]) or \
                re.match(r"s_addk_i32 " + reg + r", (\S+)$", lines[t])
            if a:
                try:
                    step = parse_imm(a.group(1))
                except ValueError:
                    return None
        if step is None:
            return None
        # Initial value: the last move into the register before the loop header.
        head = next((i for i, l in enumerate(body) if l.startswith("." + "L" + header + ":")), None)
        init = None
        for l in body[:head]:
            mv = re.match(r"\s*s_mov(k?)_[bi]32 " + reg + r", (\S+)$", l)
            if mv:
                try:
                    init = parse_imm(mv.group(2))
                    if mv.group(1) and init >= 0x8000:
                        init -= 0x10000
                except ValueError:
                    init = None
        if init is None:
            return None
        signed = cmp.group(3) == "i32"
        v, trips = init, 0
        while trips < 100000:
            trips += 1
            v += step
            a = v if signed else v & 0xFFFFFFFF
            b = n if signed else n & 0xFFFFFFFF
            if int(CMP[cmp.group(2)](a, b)) != taken_on:
                return trips
        return None
    return None


def vector_trip(header, lines):
    """Per-lane loop: `v_add vX, C, vX` and `v_cmp_lt/gt vcc, N, vX`: about (N + 1) / C."""
    for s in lines:
        m = re.match(r"v_cmp_(lt|gt|le|ge)_u32_e(?:32|64) (?:vcc|s\[\d+:\d+\]), (\d+), (v\d+)$", s)
        if not m:
            continue
        n, reg = int(m.group(2)), m.group(3)
        for t in lines:
            a = re.match(r"v_add_u32_e32 " + reg + r", (\d+), " + reg + r"$", t)
            if a and int(a.group(1)) > 0:
                return math.ceil((n + 1) / int(a.group(1)))
    return None


def per_tile(body):
    loops = loops_of(body)
    if not loops:
        return None
    tile = max(loops, key=lambda h: loops[h]["counts"]["mfma"])
    if loops[tile]["counts"]["mfma"] == 0:
        return None
    approx = False
    unknown = []

    def total(h):
        nonlocal approx
        c = dict(loops[h]["counts"])
        for ch in loops[h]["children"]:
            n = scalar_trip(body, ch, loops[ch]["lines"])
            if n is None:
                n = vector_trip(ch, loops[ch]["lines"])
                approx = True
            if n is None:
                n = 1
                unknown.append(ch)
            sub = total(ch)
            for k in KINDS:
                c[k] += n * sub[k]
        return c

    c = total(tile)
    c["approx"] = approx and not unknown
    c["unknown"] = bool(unknown)
    return c


# ---- names and the table --------------------------------------------------------------------------
def demangle(names):
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                             text=True, check=True).stdout.splitlines()
        return out if len(out) == len(names) else names
    except (OSError, subprocess.CalledProcessError):
        return names


def short_name(d):
    m = re.search(r"decode_kernel<mlakit::detail::DecodeTraits<mlakit::Problem<mlakit::(\w+), "
                  r"(?:mlakit::)?(\w+), (-?\d+), (-?\d+), \(mlakit::Causal\)(\d)"
                  r"(?:, \(mlakit::CacheForm\)(\d))?>, (\d+)(?:, (?:true|false))?> >", d)
    if m:
        q, kv, h, ql, c, form, pol = m.groups()
        q = q.replace("_t", "")
        kv = {"kv_any_t": "any"}.get(kv, kv.replace("fp8_", "").replace("_t", ""))
        shape = "" if h == "0" else f" h{h} q{ql}"
        causal = {"0": " no-mask", "1": " causal", "2": ""}[c]
        rope = " kv_rope" if form == "1" else ""
        return f"decode {q}/{kv}{shape}{causal}{rope} (policy {pol})", int(pol)
    m = re.search(r"(plan_kernel|combine_kernel)<([^>]*)>", d)
    if m:
        return f"{m.group(1)}<{m.group(2).replace('mlakit::', '')}>", None
    return d[:60], None


def waves(arch, vgpr, agpr, sgpr, lds, threads):
    # .vgpr_count counts both files on gfx90a+: architectural = vgpr - agpr.
    regs = -(-(-(-(vgpr - agpr) // 4) * 4 + agpr) // 8) * 8
    by_regs = min(8, 512 // max(regs, 1))
    by_sgpr = min(8, 800 // max(-(-sgpr // 16) * 16, 16))
    waves_per_wg = -(-threads // 64)
    limits = {"regs": by_regs, "sgpr": by_sgpr}
    if lds > 0:
        wg_per_cu = lds_per_cu(arch) // lds
        limits["lds"] = wg_per_cu * waves_per_wg / 4
    w = min(limits.values())
    lim = "/".join(k for k, v in limits.items() if v == w)
    return w, lim


def fmt_w(w):
    return str(int(w)) if w == int(w) else f"{w:g}"


def main(argv):
    md = "--markdown" in argv
    specs = [a for a in argv if "=" in a and not a.startswith("--")]
    if not specs:
        print(__doc__)
        return 2
    pols = hip_policies()
    rows = []
    for spec in specs:
        arch, path = spec.split("=", 1)
        text = Path(path).read_text()
        kernels = parse_metadata(text)
        names = [k.get(".name") or k.get("name") for k in kernels]
        for k, d in zip(kernels, demangle(names)):
            label, pol = short_name(d)
            get = lambda key: int(k.get("." + key, k.get(key, "0")) or 0)  # noqa: E731
            vgpr, agpr, sgpr = get("vgpr_count"), get("agpr_count"), get("sgpr_count")
            static_lds = get("group_segment_fixed_size")
            threads = get("max_flat_workgroup_size")
            dyn = decode_lds_bytes(pols[pol]) if pol is not None and pol < len(pols) else 0
            lds = static_lds + dyn
            w, lim = waves(arch, vgpr, agpr, sgpr, lds, threads)
            t = per_tile(function_body(text, k.get(".name") or k.get("name"))) if pol is not None else None
            rows.append([arch, label, vgpr - agpr, agpr, sgpr, get("vgpr_spill_count"),
                         get("sgpr_spill_count"), get("private_segment_fixed_size"),
                         f"{lds}" + (f" ({dyn} dyn)" if dyn else ""), threads,
                         f"{fmt_w(w)} ({lim})",
                         "" if t is None else t["mfma"],
                         "" if t is None else ("~" if t["approx"] else "") + str(t["gload"])
                         + ("+" if t["unknown"] else ""),
                         "" if t is None else f"{t['ds_read']} / {t['ds_write']}"])
    head = ["target", "kernel", "VGPR", "AGPR", "SGPR", "VGPR spill", "SGPR spill",
            "scratch B", "LDS B", "threads", "waves/SIMD (limit)", "MFMA/tile",
            "global loads/tile", "LDS rd / wr per tile"]
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "|".join(" --- " if i < 2 else " ---: " for i in range(len(head))) + "|")
        for r in rows:
            print("| " + " | ".join(str(x) for x in r) + " |")
    else:
        widths = [max(len(str(r[i])) for r in rows + [head]) for i in range(len(head))]
        for r in [head] + rows:
            print("  ".join(str(x).ljust(widths[i]) for i, x in enumerate(r)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
