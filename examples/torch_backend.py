#!/usr/bin/env python3
"""mlakit as a serving engine's MLA attention backend, from Python: the speculative-decoding
verify step of DeepSeek-V3-style models (bf16 Q, fp8 e4m3fn cache with one scale per layer,
16 or 12 heads per GPU, q_len 8 = 7 draft tokens + 1), one CUDA graph per batch size up to 32,
replayed while the lengths and page tables change every step.

    python examples/torch_backend.py              # 16 heads; --heads 12 for 12
    python examples/torch_backend.py --check      # also compares every step with the reference

Needs a CUDA GPU and the mlakit package (pip install --no-build-isolation ./python).
"""
import argparse

import torch

import mlakit


class MlaDecodeBackend:
    """Decode attention of one model for an engine that captures CUDA graphs per batch size.

    Graph-static buffers: the engine writes Q, the block table and the lengths of the current
    step into them, then replays the graph of that batch size. The cache and its scale belong
    to the layer; a graph captures the layer's call with them."""

    def __init__(self, num_heads, q_len, max_batch, max_pages, device="cuda"):
        self.num_heads, self.q_len = num_heads, q_len
        self.q = torch.zeros(max_batch, q_len, num_heads, 576, dtype=torch.bfloat16, device=device)
        self.out = torch.zeros(max_batch, q_len, num_heads, 512, dtype=torch.bfloat16, device=device)
        self.block_table = torch.zeros(max_batch, max_pages, dtype=torch.int32, device=device)
        self.kv_len = torch.zeros(max_batch, dtype=torch.int32, device=device)
        # The workspace for the largest batch, before any capture: no allocation in a graph.
        mlakit.workspace(batch=max_batch, num_heads=num_heads, q_len=q_len, device=device)
        self.graphs = {}

    def attention(self, batch, kv_cache, kv_scale, softmax_scale):
        """The layer's decode for the first `batch` requests (what a graph captures).
        kv_cache [pages, page_size, 576] float8_e4m3fn; kv_scale a Python float (a graph
        captures it by value)."""
        mlakit.decode(self.q[:batch], kv_cache, self.kv_len[:batch], block_table=self.block_table[:batch],
                      softmax_scale=softmax_scale, kv_scale=kv_scale, causal=True, out=self.out[:batch])
        return self.out[:batch]

    def capture(self, batch_sizes, kv_cache, kv_scale, softmax_scale):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up, as engines do before capturing
            self.attention(max(batch_sizes), kv_cache, kv_scale, softmax_scale)
        torch.cuda.current_stream().wait_stream(stream)
        for bs in batch_sizes:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.attention(bs, kv_cache, kv_scale, softmax_scale)
            self.graphs[bs] = g

    def step(self, batch):
        """Replays the graph of this batch size; the step's inputs are already in the buffers."""
        self.graphs[batch].replay()
        return self.out[:batch]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=16, choices=[12, 16])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--check", action="store_true", help="compare every step with mlakit.decode_reference")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    q_len, page_size, max_batch, max_len = 8, 64, 32, 4096
    max_pages = max_len // page_size
    pages = max_batch * max_pages
    kv_scale = 0.0125  # the layer's fp8 dequantisation scale
    softmax_scale = 192 ** -0.5  # DeepSeek-V3: (128 + 64) ** -0.5 before absorption
    cache = (torch.randn(pages, page_size, 576, device="cuda") / kv_scale).to(torch.float8_e4m3fn)

    backend = MlaDecodeBackend(a.heads, q_len, max_batch, max_pages)
    backend.capture(list(range(1, max_batch + 1)), cache, kv_scale, softmax_scale)

    worst = 0.0
    for step in range(a.steps):
        batch = [1, 7, 32, 19][step % 4]
        # The engine's scheduler fills the static buffers for this step.
        backend.q[:batch].copy_(torch.randn(batch, q_len, a.heads, 576, device="cuda"))
        perm = torch.randperm(pages, device="cuda")[:batch * max_pages].view(batch, max_pages)
        backend.block_table[:batch].copy_(perm.to(torch.int32))
        backend.kv_len[:batch].copy_(torch.randint(q_len, max_len + 1, (batch,), device="cuda", dtype=torch.int32))
        out = backend.step(batch)
        if a.check:
            ref, _ = mlakit.decode_reference(backend.q[:batch], cache, backend.kv_len[:batch],
                                             block_table=backend.block_table[:batch],
                                             softmax_scale=softmax_scale, kv_scale=kv_scale)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            worst = max(worst, err)
            print(f"step {step}: batch {batch}, relative L2 error {err:.2e} against the reference")
        else:
            torch.cuda.synchronize()
            print(f"step {step}: batch {batch} replayed")
    if a.check and not worst < 1e-2:
        raise SystemExit(f"relative L2 error {worst:.2e} (bound 1e-2)")
    return worst


if __name__ == "__main__":
    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    main()
