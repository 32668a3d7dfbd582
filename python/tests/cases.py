"""Random decode problems shared by the CPU and GPU tests."""
import math

import torch

import mlakit


def make_case(batch=3, q_len=4, heads=16, q_dtype=torch.bfloat16, kv_dtype=torch.bfloat16,
              page_size=64, kv_lens=(0, 37, 300), extra_pages=1, seed=0, device="cpu"):
    """q, a shuffled paged cache, its block table and CSR page ids, kv_len; every request gets
    `extra_pages` pages past the ones its length needs (page ids there are valid)."""
    assert len(kv_lens) == batch
    g = torch.Generator().manual_seed(seed)
    pages_per = [math.ceil(max(n, 0) / page_size) + extra_pages for n in kv_lens]
    total = sum(pages_per) + 2
    perm = torch.randperm(total, generator=g).tolist()
    kv = torch.randn(total, page_size, 576, generator=g)
    q = torch.randn(batch, q_len, heads, 576, generator=g)
    table = torch.zeros(batch, max(pages_per, default=1), dtype=torch.int32)
    indptr = [0]
    indices = []
    for b, n in enumerate(pages_per):
        ids = perm[:n]
        perm = perm[n:]
        table[b, :n] = torch.tensor(ids, dtype=torch.int32)
        indices += ids
        indptr.append(len(indices))
    return dict(
        q=q.to(q_dtype).to(device),
        kv_cache=kv.to(kv_dtype).to(device),
        block_table=table.to(device),
        kv_indptr=torch.tensor(indptr, dtype=torch.int32, device=device),
        kv_indices=torch.tensor(indices, dtype=torch.int32, device=device),
        kv_len=torch.tensor(kv_lens, dtype=torch.int32, device=device),
    )


def page_ids(case, kind):
    if kind == "table":
        return dict(block_table=case["block_table"])
    return dict(kv_indptr=case["kv_indptr"], kv_indices=case["kv_indices"])


def rel_l2(a, b):
    a = a.double()
    b = b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference(case, kind="table", **kw):
    return mlakit.decode_reference(case["q"], case["kv_cache"], case["kv_len"], **page_ids(case, kind), **kw)
