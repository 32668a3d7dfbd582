"""GPU tests of the FlashMLA and FlashInfer adapters as an engine runs them, inside CUDA graphs:
each adapter call, captured, holds the same nodes (kernels by name, memsets, copies) as
torch.ops.mlakit.decode captured for the same call with preallocated outputs, also where the
LSE convention is not mlakit's default (FlashMLA's +inf for an empty row, FlashInfer's base 2:
the kernels write it); replays write the right values in the caller's layout (outputs
NaN-poisoned before each replay); eager calls do not synchronise. Skipped without a CUDA GPU."""
import math

import pytest
import torch

import mlakit
from cases import make_case
from graph_nodes import capture
from test_gpu import SCALE, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", autouse=True)
def extension():
    assert mlakit.has_cuda_extension(), f"a GPU is present but mlakit._C did not load: {mlakit._ext.LOAD_ERROR}"
    torch.backends.cuda.matmul.allow_tf32 = False


def op_call(q, kv, lens, out, lse, kv_scale, causal, **ids):
    """torch.ops.mlakit.decode with preallocated outputs: what the adapters are held to."""
    def call():
        torch.ops.mlakit.decode(q, kv, ids.get("block_table"), ids.get("kv_indptr"), ids.get("kv_indices"),
                                lens, out, lse, SCALE, kv_scale, causal)
    return call


def assert_same_nodes(op, adapter, extra_kernels=0, label=""):
    """The adapter's captured graph holds the op's nodes plus `extra_kernels` kernels (and, where
    the driver names kernels, the op's kernels by name)."""
    op_kinds, op_names = op
    ad_kinds, ad_names = adapter
    want = op_kinds.copy()
    want["kernel"] += extra_kernels
    assert op_kinds["kernel"] >= 1
    assert ad_kinds == want, (f"{label}: adapter nodes {dict(ad_kinds)}, op nodes {dict(op_kinds)} "
                              f"(+{extra_kernels} kernels expected)")
    if op_names is not None and ad_names is not None:
        missing = list(op_names)
        for n in ad_names:
            if n in missing:
                missing.remove(n)
        assert not missing, f"{label}: the op's kernels {missing} are not in the adapter's graph"


def poison(*tensors):
    for t in tensors:
        t.fill_(math.nan)


# ---- FlashMLA ------------------------------------------------------------------------------------

FLASHMLA_SHAPES = [(1, 1, (8192,)), (1, 8, (8192,)), (4, 2, (0, 1, 64, 1000)), (3, 8, (7, 0, 2048))]


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("batch,q_len,lens", FLASHMLA_SHAPES)
def test_flashmla_adapter_graph_holds_the_op_kernels(batch, q_len, lens, kv_dtype):
    from mlakit import flashmla
    case = make_case(batch=batch, q_len=q_len, heads=16, kv_dtype=kv_dtype, page_size=64, kv_lens=lens,
                     device="cuda", seed=batch * 10 + q_len)
    q, kv, table, kv_len = case["q"], case["kv_cache"], case["block_table"], case["kv_len"]
    k_cache = kv.unsqueeze(2)
    kv_scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    meta, splits = flashmla.get_mla_metadata(kv_len, q_len * 16, 1)
    out = torch.empty(batch, q_len, 16, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(batch, 16, q_len, device="cuda")  # FlashMLA's layout, through its view
    g_op, _, *op = capture(op_call(q, k_cache, kv_len, out, lse.transpose(1, 2), kv_scale, True, block_table=table))

    for empty_lse, extra in ((-math.inf, 0), (math.inf, 0)):
        def call():
            return flashmla.flash_mla_with_kvcache(q, k_cache, table, kv_len, 512, meta, splits, causal=True,
                                                   kv_scale=kv_scale, empty_lse=empty_lse)
        g, (o, l), *ad = capture(call)
        assert_same_nodes(op, ad, extra, f"empty_lse={empty_lse}")
        assert o.shape == (batch, q_len, 16, 512) and l.shape == (batch, 16, q_len) and l.is_contiguous()
        poison(o, l)
        g.replay()
        lse_bsh = l.transpose(1, 2).clone()
        empty = torch.isinf(lse_bsh)
        assert torch.all(lse_bsh[empty] == empty_lse)  # FlashMLA's +inf, or mlakit's -inf
        lse_bsh[empty] = -math.inf
        check(case, o, lse_bsh, kv_scale=kv_scale)
    # The op's own graph writes the same values.
    poison(out, lse)
    g_op.replay()
    check(case, out, lse.transpose(1, 2), kv_scale=kv_scale)


def test_flashmla_adapter_writes_the_callers_out_and_does_not_synchronise():
    from mlakit import flashmla
    case = make_case(batch=2, q_len=4, heads=16, page_size=64, kv_lens=(300, 5), device="cuda", seed=3)
    q, k_cache = case["q"], case["kv_cache"].unsqueeze(2)
    scale = torch.tensor([1.0], device="cuda")  # a device descale_k: read once, then cached
    flashmla.flash_mla_with_kvcache(q, k_cache, case["block_table"], case["kv_len"], 512, None, None,
                                    causal=True, descale_k=scale)
    out = torch.full((2, 4, 16, 512), math.nan, dtype=q.dtype, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, lse = flashmla.flash_mla_with_kvcache(q, k_cache, case["block_table"], case["kv_len"], 512, None,
                                                 None, causal=True, descale_k=scale, out=out)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert o is out
    check(case, out, lse.transpose(1, 2))


# ---- FlashInfer ----------------------------------------------------------------------------------

def flashinfer_problem(batch, q_len, lens, kv_dtype, page_size=1, seed=0):
    case = make_case(batch=batch, q_len=q_len, heads=16, kv_dtype=kv_dtype, page_size=page_size,
                     kv_lens=lens, device="cuda", seed=seed)
    q = case["q"].reshape(batch * q_len, 16, 576)  # SGLang: q_nope and q_pe are views of one q
    return case, q


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("batch,q_len,lens", [(1, 1, (8192,)), (1, 8, (8192,)), (5, 2, (0, 3, 100, 700, 33))])
def test_flashinfer_adapter_graph_holds_the_op_kernels(batch, q_len, lens, kv_dtype):
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case, q = flashinfer_problem(batch, q_len, lens, kv_dtype, seed=q_len)
    kv = case["kv_cache"]
    fp8 = kv_dtype == torch.float8_e4m3fn
    scales = dict(ckv_scale=0.5, kpe_scale=0.5) if fp8 else {}
    bufs = dict(kv_indptr=torch.empty(64, dtype=torch.int32, device="cuda"),
                kv_indices=torch.empty(1 << 16, dtype=torch.int32, device="cuda"),
                kv_len_arr=torch.empty(64, dtype=torch.int32, device="cuda"))
    w = BatchMLAPagedAttentionWrapper(None, use_cuda_graph=True, **bufs)
    w.plan(torch.arange(batch + 1, dtype=torch.int32) * q_len, case["kv_indptr"], case["kv_indices"],
           case["kv_len"], 16, 512, 64, 1, q_len > 1, SCALE, torch.bfloat16, kv_dtype)
    p = w._plan
    out = torch.empty(batch * q_len, 16, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(batch * q_len, 16, device="cuda")
    o4, l3 = out.view(batch, q_len, 16, 512), lse.view(batch, q_len, 16)
    kv_scale = 0.5 if fp8 else 1.0
    ids = dict(kv_indptr=p["kv_indptr"], kv_indices=p["kv_indices"])
    _, _, *op_plain = capture(op_call(q.view(batch, q_len, 16, 576), kv, p["kv_len"], o4, None, kv_scale,
                                      q_len > 1, **ids))
    _, _, *op_lse = capture(op_call(q.view(batch, q_len, 16, 576), kv, p["kv_len"], o4, l3, kv_scale,
                                    q_len > 1, **ids))
    views = (q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:])
    forms = [
        ("out only", dict(out=out), op_plain, 0),
        ("natural-log lse", dict(return_lse=True, return_lse_base_on_e=True), op_lse, 0),
        ("base-2 lse", dict(out=out, lse=lse, return_lse=True), op_lse, 0),
    ]
    for name, kw, op, extra in forms:
        g, res, *ad = capture(lambda: w.run(*views, **kw, **scales))
        assert_same_nodes(op, ad, extra, name)
        o, l = res if isinstance(res, tuple) else (res, None)
        poison(o, *([] if l is None else [l]))
        g.replay()
        o4 = o.view(batch, q_len, 16, 512)
        if l is None:
            check_out_only(case, o4, causal=q_len > 1, kv_scale=kv_scale)
        else:
            lse_e = l if kw.get("return_lse_base_on_e") else l * math.log(2.0)
            check(case, o4, lse_e.view(batch, q_len, 16), "csr", causal=q_len > 1, kv_scale=kv_scale)


def check_out_only(case, out, causal, kv_scale):
    from cases import reference, rel_l2
    torch.cuda.synchronize()
    ref, ref_lse = reference(case, "csr", softmax_scale=SCALE, causal=causal, kv_scale=kv_scale)
    seen = torch.isfinite(ref_lse)
    assert torch.all(out[~seen] == 0)
    if seen.any():
        assert rel_l2(out[seen].float(), ref[seen]) < 1e-2


def test_flashinfer_adapter_empty_cache_in_a_graph():
    """No request has keys and the cache has no page (FlashInfer's kv_len 0 cases): the cache
    tensors are empty (null) and nothing is read."""
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    batch, q_len = 4, 3
    q = torch.randn(batch * q_len, 16, 576, device="cuda").bfloat16()
    ckv = torch.empty(0, 16, 512, dtype=torch.bfloat16, device="cuda")
    kpe = torch.empty(0, 16, 64, dtype=torch.bfloat16, device="cuda")
    bufs = dict(kv_indptr=torch.empty(batch + 1, dtype=torch.int32, device="cuda"),
                kv_indices=torch.empty(1024, dtype=torch.int32, device="cuda"),
                kv_len_arr=torch.empty(batch, dtype=torch.int32, device="cuda"))
    w = BatchMLAPagedAttentionWrapper(None, use_cuda_graph=True, **bufs)
    z = dict(dtype=torch.int32, device="cuda")
    w.plan(torch.arange(batch + 1, **z) * q_len, torch.zeros(batch + 1, **z), torch.zeros(0, **z),
           torch.zeros(batch, **z), 16, 512, 64, 16, False, SCALE, torch.bfloat16, torch.bfloat16)
    g, (o, l), kinds, _ = capture(lambda: w.run(q[..., :512], q[..., 512:], ckv, kpe, return_lse=True))
    assert kinds["kernel"] >= 1
    poison(o, l)
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(o == 0) and torch.all(l == -math.inf)


def test_flashinfer_adapter_does_not_synchronise():
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case, q = flashinfer_problem(3, 2, (40, 0, 300), torch.bfloat16, seed=9)
    kv = case["kv_cache"]
    w = BatchMLAPagedAttentionWrapper(None)
    w.plan(torch.arange(4, dtype=torch.int32) * 2, case["kv_indptr"], case["kv_indices"], case["kv_len"], 16,
           512, 64, 1, True, SCALE, torch.bfloat16, torch.bfloat16)
    w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:])
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        o, l = w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], return_lse=True,
                     return_lse_base_on_e=True)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    check(case, o.view(3, 2, 16, 512), l.view(3, 2, 16), "csr", causal=True)
