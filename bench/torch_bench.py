#!/usr/bin/env python3
"""Times torch.ops.mlakit.decode against the MLA decode kernels of whichever peers are
installed (FlashMLA, FlashInfer), and against mlakit's own adapters for their interfaces
(mlakit.flashmla, mlakit.flashinfer), with one harness and the same inputs, on this GPU.

    python bench/torch_bench.py                          # 16 heads, q_len 1 2 4 8, bf16 cache
    python bench/torch_bench.py --kv-dtype fp8 --batch 64 --kv-len 4096 --q-len 1 8
    python bench/torch_bench.py --batch 1 --peers mlakit adapters --rounds 2   # adapter overhead
    python bench/torch_bench.py --json results.json
    python bench/torch_bench.py --batch 8 --q-len 8 --rotate-mb 480   # caches read from memory

Rows: `mlakit` is torch.ops.mlakit.decode with preallocated out and lse, planning in every call;
`mlakit-plan-once` the same with one plan per graph (the first call plans, the others run
plan_step="decode_only", as the layers of a model step share a plan); `mla-flashmla` is
mlakit.flashmla.flash_mla_with_kvcache as an engine calls it (FlashMLA's +inf LSE for an empty
row, written by the kernels; one plan per metadata object, so within a graph the first call
plans and the others reuse it), `mla-flashmla-ninf` the same with empty_lse=-inf;
`mla-flashinfer` is mlakit.flashinfer's run() with q_nope / q_pe and the cache parts as views of
one tensor, out and a natural-log lse preallocated (one plan per plan() call likewise).
`mlakit-fp8-matrix` is the op with compute="fp8_matrix" (e4m3fn caches). `flashmla` is
FlashMLA's dense decode; for an e4m3fn cache it reads the cache's bf16 image (its dense decode
takes bf16 only), so an fp8 row's ratio to it is the fp8 cache against FlashMLA's bf16 time.
`mlakit-csr` is the op with CSR page ids, the baseline of `mla-flashinfer` (the FlashInfer
interface passes CSR ids). `--peers adapters` names these four rows. Each repetition times every
row in turn (a drift of the clocks moves them alike); with --rounds N the whole sweep runs N
times, so the spread of the op's own time between rounds shows the run-to-run noise.

Each kernel runs the same problem: batch requests of kv-len cached tokens (causal, the q_len
new tokens included), a paged latent cache (576 values per token) with a shuffled block table.
Every call is captured in a CUDA graph and replayed (launch overhead excluded, as in serving;
a kernel that cannot be captured is timed with plain launches and marked so); the time is the
median over --reps repetitions of --iters calls each. With --rotate-mb M the calls of a graph
cycle over copies of the inputs whose caches add up to at least M MB (480 exceeds the L2 of an
H100 or H200 nine times), so that a small batch's cache is read from memory, not left in L2 by
the call before. Every peer's output is
compared with mlakit's (relative L2), so a fast wrong answer shows. A peer that is missing or
rejects the shape is reported with the reason instead of a time.
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch

try:
    import mlakit
except ImportError:  # not installed: the package of this checkout (built in place)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    try:
        import mlakit
    except ImportError:
        sys.exit("mlakit is not installed: pip install --no-build-isolation ./python")


def make_inputs(batch, q_len, heads, kv_len, page_size, kv_dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages_per = math.ceil(kv_len / page_size)
    pages = batch * pages_per
    q = torch.randn(batch, q_len, heads, 576, device="cuda", generator=g).bfloat16()
    kv = torch.randn(pages, page_size, 576, device="cuda", generator=g)
    kv = kv.to(torch.float8_e4m3fn if kv_dtype == "fp8" else torch.bfloat16)
    table = torch.randperm(pages, device="cuda", generator=g).to(torch.int32).view(batch, pages_per)
    lens = torch.full((batch,), kv_len, dtype=torch.int32, device="cuda")
    return dict(q=q, kv=kv, table=table, lens=lens, scale=576 ** -0.5)


def setup_mlakit(t, kv_scale, compute="standard"):
    out = torch.empty(t["q"].shape[:3] + (512,), dtype=t["q"].dtype, device="cuda")
    lse = torch.empty(t["q"].shape[:3], device="cuda")

    def call():
        mlakit.decode(t["q"], t["kv"], t["lens"], block_table=t["table"], softmax_scale=t["scale"],
                      kv_scale=kv_scale, out=out, lse=lse, compute=compute)
        return out
    return call


def setup_mlakit_fp8_matrix(t, kv_scale):
    """The op in its opt-in fp8 matrix mode (e4m3fn caches only)."""
    return setup_mlakit(t, kv_scale, compute="fp8_matrix")


def setup_mlakit_plan_once(t, kv_scale):
    """The op as the layers of one model step call it: the first call of a graph (or of a run
    of eager calls) plans, the others decode with its plan (plan_step="decode_only"), as
    FlashMLA's calls share the schedule get_mla_metadata made once."""
    from mlakit import _workspace
    q = t["q"]
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype, device="cuda")
    lse = torch.empty(q.shape[:3], device="cuda")
    ws = mlakit.workspace(batch=q.shape[0], num_heads=q.shape[2], q_len=q.shape[1])
    key = _workspace.plan_key(q, t["kv"], t["table"], None, t["lens"], True, 0, 0, None)

    def call():
        mlakit.decode(q, t["kv"], t["lens"], block_table=t["table"], softmax_scale=t["scale"],
                      kv_scale=kv_scale, out=out, lse=lse, workspace=ws,
                      plan_step=_workspace.step_for(ws, key, True))
        return out
    return call


def setup_mlakit_csr(t, kv_scale):
    """The op with CSR page ids (the form the FlashInfer interface passes): the baseline of the
    mla-flashinfer row."""
    out = torch.empty(t["q"].shape[:3] + (512,), dtype=t["q"].dtype, device="cuda")
    lse = torch.empty(t["q"].shape[:3], device="cuda")
    table = t["table"]
    indptr = torch.arange(table.shape[0] + 1, dtype=torch.int32, device="cuda") * table.shape[1]
    indices = table.flatten().contiguous()

    def call():
        mlakit.decode(t["q"], t["kv"], t["lens"], kv_indptr=indptr, kv_indices=indices, softmax_scale=t["scale"],
                      kv_scale=kv_scale, out=out, lse=lse)
        return out
    return call


def setup_flashmla(t, kv_scale):
    import flash_mla
    # FlashMLA's dense decode reads bf16 caches only (its fp8 decode is the sparse one, with a
    # 656-byte row): an e4m3fn cache is given to it as its bf16 image (the same values, kv_scale
    # applied exactly), the bf16 time the fp8 rows are compared with.
    kv = t["kv"] if t["kv"].dtype == torch.bfloat16 else (t["kv"].to(torch.bfloat16) * kv_scale)
    k_cache = kv.unsqueeze(2)
    q = t["q"]
    meta, splits = flash_mla.get_mla_metadata(t["lens"], q.shape[1] * q.shape[2], 1)

    def call():
        return flash_mla.flash_mla_with_kvcache(q, k_cache, t["table"], t["lens"], 512, meta, splits,
                                                softmax_scale=t["scale"], causal=True)[0]
    return call


def setup_flashinfer(t, kv_scale):
    import flashinfer
    q, kv, table = t["q"], t["kv"], t["table"]
    batch, q_len, heads, _ = q.shape
    page_size = kv.shape[1]
    ws = torch.empty(128 * 1024 * 1024, dtype=torch.uint8, device="cuda")
    w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * table.shape[1]
    w.plan(qo_indptr, kv_indptr, table.flatten().contiguous(), t["lens"], heads, 512, 64, page_size,
           q_len > 1, t["scale"], q.dtype, kv.dtype)
    qf = q.reshape(batch * q_len, heads, 576)
    q_nope, q_pe = qf[..., :512].contiguous(), qf[..., 512:].contiguous()
    ckv, kpe = kv[..., :512], kv[..., 512:]

    def call():
        return w.run(q_nope, q_pe, ckv, kpe).view(batch, q_len, heads, 512)
    return call


def setup_adapter_flashmla(t, kv_scale, empty_lse=math.inf):
    from mlakit import flashmla
    q, k_cache = t["q"], t["kv"].unsqueeze(2)
    meta, splits = flashmla.get_mla_metadata(t["lens"], q.shape[1] * q.shape[2], 1)

    def call():
        return flashmla.flash_mla_with_kvcache(q, k_cache, t["table"], t["lens"], 512, meta, splits,
                                               softmax_scale=t["scale"], causal=True, kv_scale=kv_scale,
                                               empty_lse=empty_lse)[0]
    return call


def setup_adapter_flashmla_ninf(t, kv_scale):
    return setup_adapter_flashmla(t, kv_scale, empty_lse=-math.inf)


def setup_adapter_flashinfer(t, kv_scale):
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    q, kv, table = t["q"], t["kv"], t["table"]
    batch, q_len, heads, _ = q.shape
    w = BatchMLAPagedAttentionWrapper(None)
    qo_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
    kv_indptr = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * table.shape[1]
    w.plan(qo_indptr, kv_indptr, table.flatten().contiguous(), t["lens"], heads, 512, 64, kv.shape[1],
           q_len > 1, t["scale"], q.dtype, kv.dtype)
    qf = q.reshape(batch * q_len, heads, 576)  # q_nope and q_pe as views of one tensor (SGLang)
    out = torch.empty(batch * q_len, heads, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(batch * q_len, heads, device="cuda")
    scales = dict(ckv_scale=kv_scale, kpe_scale=kv_scale) if kv.dtype == torch.float8_e4m3fn else {}

    def call():
        w.run(qf[..., :512], qf[..., 512:], kv[..., :512], kv[..., 512:], out=out, lse=lse,
              return_lse=True, return_lse_base_on_e=True, **scales)
        return out.view(batch, q_len, heads, 512)
    return call


PEERS = {"mlakit": setup_mlakit, "mlakit-fp8-matrix": setup_mlakit_fp8_matrix, "mlakit-plan-once": setup_mlakit_plan_once, "mlakit-csr": setup_mlakit_csr, "mla-flashmla": setup_adapter_flashmla,
         "mla-flashmla-ninf": setup_adapter_flashmla_ninf, "mla-flashinfer": setup_adapter_flashinfer,
         "flashmla": setup_flashmla, "flashinfer": setup_flashinfer}
ADAPTERS = ["mla-flashmla", "mla-flashmla-ninf", "mlakit-csr", "mla-flashinfer"]
BASELINE = {"mla-flashinfer": "mlakit-csr"}  # a row's time is compared with this row's (else mlakit's)


def prepare(call, iters):
    """(run, mode): a CUDA graph of `iters` calls and its replay, or plain launches when the
    kernel cannot be captured (then the time includes launch overhead)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            call()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(iters):
                call()
        run, mode = g.replay, "graph"
        run()
    except Exception:  # not capturable: time plain calls
        torch.cuda.synchronize()

        def run():
            for _ in range(iters):
                call()
        mode = "eager"
    torch.cuda.synchronize()
    return run, mode


def cycle(calls):
    """One call that runs the next of `calls` each time (each on its own copy of the inputs)."""
    n = [0]

    def call():
        c = calls[n[0] % len(calls)]
        n[0] += 1
        return c()
    return call


def time_once(run, iters):
    """Microseconds per call of one run() (iters calls)."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    run()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000.0 / iters


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--q-len", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--kv-len", type=int, default=8192)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--kv-dtype", choices=["bf16", "fp8"], default="bf16")
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS) + ["adapters"],
                   help="rows to time; 'adapters' names " + ", ".join(ADAPTERS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--rounds", type=int, default=1, help="repeat the whole sweep (run-to-run noise)")
    p.add_argument("--rotate-mb", type=float, default=0,
                   help="cycle the calls of a graph over copies of the inputs whose caches add up to at "
                        "least this many MB (0: every call reads the same cache, which may stay in L2)")
    p.add_argument("--json", help="also write the results to this file")
    a = p.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA GPU")
    peers = []
    for name in a.peers:
        for n in (ADAPTERS if name == "adapters" else [name]):
            if n not in peers:
                peers.append(n)
    print(f"{torch.cuda.get_device_name()}; batch {a.batch}, {a.heads} heads, kv_len {a.kv_len}, "
          f"page {a.page_size}, bf16 Q, {a.kv_dtype} cache, causal, caches rotated over {a.rotate_mb:g} MB")
    print(f"{'round':>5} {'q_len':>5}  {'kernel':<18} {'us':>9} {'TB/s':>6} {'TFLOP/s':>8}  vs mlakit")
    results = []
    kv_scale = 0.5 if a.kv_dtype == "fp8" else 1.0
    for rnd in range(a.rounds):
        for q_len in a.q_len:
            t = make_inputs(a.batch, q_len, a.heads, a.kv_len, a.page_size, a.kv_dtype)
            kv_bytes = a.batch * a.kv_len * 576 * t["kv"].element_size()
            # Copies of the inputs the graph's calls cycle through, so that the caches a graph
            # reads exceed --rotate-mb and a call finds no KV left in L2 by the previous one.
            sets = [t] + [make_inputs(a.batch, q_len, a.heads, a.kv_len, a.page_size, a.kv_dtype, seed=i)
                          for i in range(1, max(1, math.ceil(a.rotate_mb * 1e6 / kv_bytes)))]
            iters = math.ceil(a.iters / len(sets)) * len(sets)
            flops = 2 * a.batch * q_len * a.heads * a.kv_len * (576 + 512)
            # A graph holds the addresses of its call's buffers, not the buffers: `calls` keeps
            # every call (and the tensors it closes over) alive while its graph is replayed.
            rows, runs, outs, calls = {}, {}, {}, {}
            for name in peers:
                row = rows[name] = dict(round=rnd, q_len=q_len, kernel=name)
                try:
                    per_set = calls[name] = [PEERS[name](ts, kv_scale) for ts in sets]
                    outs[name] = per_set[0]().float()
                    for c in per_set[1:]:  # each set's first call (a plan, a schedule) outside the graph
                        c()
                    torch.cuda.synchronize()
                    runs[name], row["timing"] = prepare(cycle(per_set), iters)
                except Exception as e:  # a missing or refusing peer is a result too
                    row["error"] = f"{type(e).__name__}: {e}"
            # Every peer in turn within each repetition: a drift of the clocks moves them alike.
            times = {name: [] for name in runs}
            for _ in range(a.reps):
                for name, run in runs.items():
                    times[name].append(time_once(run, iters))
            base = outs.get("mlakit")
            for name in peers:
                row = rows[name]
                if "error" in row:
                    print(f"{rnd:>5} {q_len:>5}  {name:<18} {'n/a':>9}  ({row['error'][:100]})")
                    results.append(row)
                    continue
                us = statistics.median(times[name])
                diff = ((outs[name] - base).norm() / base.norm()).item() if base is not None else 0.0
                row.update(us=us, tb_s=kv_bytes / us / 1e6, tflop_s=flops / us / 1e6, rel_l2_vs_mlakit=diff)
                ref = BASELINE.get(name, "mlakit")
                vs = ""
                if name != ref and ref in times:
                    row["ratio_vs_" + ref] = us / statistics.median(times[ref])
                    vs = f"x{row['ratio_vs_' + ref]:.3f} of {ref}, rel L2 {diff:.2e}"
                print(f"{rnd:>5} {q_len:>5}  {name:<18} {us:>9.1f} {row['tb_s']:>6.2f} {row['tflop_s']:>8.1f}  "
                      f"{vs}{'' if row['timing'] == 'graph' else ' (not capturable: plain launches)'}")
                results.append(row)
            torch.cuda.synchronize()
            del runs, calls
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), args=vars(a), results=results), f, indent=1)


if __name__ == "__main__":
    main()
