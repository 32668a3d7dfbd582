#!/usr/bin/env python3
"""mlakit as a serving engine's MLA attention backend, from Python: the speculative-decoding
verify step of DeepSeek-V3-style models (bf16 Q, fp8 e4m3fn cache with one scale per layer,
16 or 12 heads per GPU, q_len 8 = 7 draft tokens + 1), one CUDA graph per batch size up to 32
holding every layer's attention, replayed while the lengths and page tables change every step.
The layers share the step's split plan: the first plans, the others decode with its plan.

    python examples/torch_backend.py              # 16 heads; --heads 12 for 12
    python examples/torch_backend.py --check      # also compares every step with the reference

Needs a CUDA GPU and the mlakit package (pip install --no-build-isolation ./python).
"""
import argparse

import torch

import mlakit


class MlaDecodeBackend:
    """Decode attention of one model for an engine that captures CUDA graphs per batch size.

    Graph-static buffers: the engine writes each layer's Q, the block table and the lengths of
    the current step into them, then replays the graph of that batch size. Each layer has its
    own cache and scale; a graph captures every layer's call with them. All layers see the same
    lengths and block table, so they share one split plan: the first layer's call plans into
    the workspace, the others read it (plan_step="decode_only") and skip the planner kernel."""

    def __init__(self, num_layers, num_heads, q_len, max_batch, max_pages, device="cuda"):
        self.num_heads, self.q_len = num_heads, q_len
        self.q = torch.zeros(num_layers, max_batch, q_len, num_heads, 576, dtype=torch.bfloat16, device=device)
        self.out = torch.zeros(num_layers, max_batch, q_len, num_heads, 512, dtype=torch.bfloat16, device=device)
        self.block_table = torch.zeros(max_batch, max_pages, dtype=torch.int32, device=device)
        self.kv_len = torch.zeros(max_batch, dtype=torch.int32, device=device)
        # The workspace for the largest batch, before any capture: no allocation in a graph.
        self.workspace = mlakit.workspace(batch=max_batch, num_heads=num_heads, q_len=q_len, device=device)
        self.graphs = {}

    def attention(self, layer, batch, kv_cache, kv_scale, softmax_scale):
        """Layer `layer`'s decode for the first `batch` requests (what a graph captures).
        kv_cache [pages, page_size, 576] float8_e4m3fn; kv_scale a Python float (a graph
        captures it by value)."""
        mlakit.decode(self.q[layer, :batch], kv_cache, self.kv_len[:batch], block_table=self.block_table[:batch],
                      softmax_scale=softmax_scale, kv_scale=kv_scale, causal=True, out=self.out[layer, :batch],
                      workspace=self.workspace, plan_step="plan_and_decode" if layer == 0 else "decode_only")
        return self.out[layer, :batch]

    def forward(self, batch, caches, kv_scales, softmax_scale):
        """Every layer's attention of one step (a model runs the rest of each layer in between)."""
        for layer, (cache, scale) in enumerate(zip(caches, kv_scales)):
            self.attention(layer, batch, cache, scale, softmax_scale)

    def capture(self, batch_sizes, caches, kv_scales, softmax_scale):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up, as engines do before capturing
            self.forward(max(batch_sizes), caches, kv_scales, softmax_scale)
        torch.cuda.current_stream().wait_stream(stream)
        for bs in batch_sizes:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.forward(bs, caches, kv_scales, softmax_scale)
            self.graphs[bs] = g

    def step(self, batch):
        """Replays the graph of this batch size; the step's inputs are already in the buffers."""
        self.graphs[batch].replay()
        return self.out[:, :batch]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--heads", type=int, default=16, choices=[12, 16])
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--check", action="store_true", help="compare every step with mlakit.decode_reference")
    a = p.parse_args(argv)
    torch.manual_seed(0)
    q_len, page_size, max_batch, max_len = 8, 64, 32, 4096
    max_pages = max_len // page_size
    pages = max_batch * max_pages
    kv_scales = [0.0125 * (1 + layer / 4) for layer in range(a.layers)]  # each layer's fp8 scale
    softmax_scale = 192 ** -0.5  # DeepSeek-V3: (128 + 64) ** -0.5 before absorption
    caches = [(torch.randn(pages, page_size, 576, device="cuda") / s).to(torch.float8_e4m3fn) for s in kv_scales]

    backend = MlaDecodeBackend(a.layers, a.heads, q_len, max_batch, max_pages)
    backend.capture(list(range(1, max_batch + 1)), caches, kv_scales, softmax_scale)

    worst = 0.0
    for step in range(a.steps):
        batch = [1, 7, 32, 19][step % 4]
        # The engine's scheduler fills the static buffers for this step.
        backend.q[:, :batch].copy_(torch.randn(a.layers, batch, q_len, a.heads, 576, device="cuda"))
        perm = torch.randperm(pages, device="cuda")[:batch * max_pages].view(batch, max_pages)
        backend.block_table[:batch].copy_(perm.to(torch.int32))
        backend.kv_len[:batch].copy_(torch.randint(q_len, max_len + 1, (batch,), device="cuda", dtype=torch.int32))
        out = backend.step(batch)
        if a.check:
            errs = []
            for layer in range(a.layers):
                ref, _ = mlakit.decode_reference(backend.q[layer, :batch], caches[layer], backend.kv_len[:batch],
                                                 block_table=backend.block_table[:batch],
                                                 softmax_scale=softmax_scale, kv_scale=kv_scales[layer])
                errs.append(((out[layer].float() - ref).norm() / ref.norm()).item())
            worst = max(worst, *errs)
            print(f"step {step}: batch {batch}, {a.layers} layers, relative L2 error "
                  f"{max(errs):.2e} at most against the reference")
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
