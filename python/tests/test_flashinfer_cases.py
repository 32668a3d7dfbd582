"""The kinds of cases FlashInfer's own MLA tests (tests/attention/test_deepseek_mla.py) run,
driven through mlakit.flashinfer.BatchMLAPagedAttentionWrapper without FlashInfer installed:
the batch taken from kv_len_arr with longer indptr arrays, the ckv and kpe caches as two tensors
of their own (FlashInfer's layout) and as two views of one pool, NaN in the cache past each request's
length, requests without keys and caches without pages, CUDA-graph index buffers, caller
buffers for out and lse (base-2 LSE), the fp8 keywords, and the calls outside the library's
domain rejected with a clear error. The reference is FlashInfer's: softmax over the
concatenated latent and rotary keys, LSE in base 2. On CPU the op runs the float32
reference (so these check the adapter's handling); on a GPU the kernels."""
import inspect
import math

import pytest
import torch

import mlakit
from mlakit.flashinfer import BatchMLAPagedAttentionWrapper

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() and mlakit.has_cuda_extension() else [])
H_CKV, H_KPE = 512, 64
DTYPE = torch.half


def attention_ref(q, k, v, qo_len, kv_len, causal, sm_scale):
    """One request: q [qo_len, H, 576], k [kv_len, 576], v [kv_len, 512] -> (o [qo_len, H, 512],
    lse [qo_len, H] base 2), as FlashInfer's test computes them."""
    logits = torch.einsum("mhd,nd->hmn", q.double(), k.double()) * sm_scale
    if causal:
        mask = torch.arange(kv_len - qo_len, kv_len).unsqueeze(1) >= torch.arange(kv_len).unsqueeze(0)
        logits = logits.masked_fill(~mask.to(logits.device), float("-inf"))
    lse = torch.logsumexp(logits, -1).transpose(0, 1)
    p = torch.softmax(logits, dim=-1) if kv_len > 0 else logits
    o = (torch.einsum("hmn,nd->mhd", p, v.double()) if kv_len > 0
         else torch.zeros(qo_len, q.shape[1], H_CKV, dtype=torch.float64, device=q.device))
    return o, lse * math.log2(math.e)


def parts(kv, layout):
    """ckv and kpe of a [pages, page_size, 576] pool: its two views (layout "joined", as SGLang
    and vLLM hold it) or two tensors of their own (layout "separate", as FlashInfer's test and
    its own pools hold them)."""
    if layout == "joined":
        return kv[..., :H_CKV], kv[..., H_CKV:]
    return kv[..., :H_CKV].clone(), kv[..., H_CKV:].clone()


def pool(pages, page_size, device, dtype=DTYPE, gen=None, layout="joined"):
    """A [pages, page_size, 576] MLA pool and its ckv and kpe parts (see parts())."""
    kv = torch.randn(pages, page_size, H_CKV + H_KPE, generator=gen).to(dtype).to(device)
    return (kv,) + parts(kv, layout)


def split_q(total, heads, device, gen, dtype=DTYPE):
    q = torch.randn(total, heads, H_CKV + H_KPE, generator=gen).to(dtype).to(device)
    return q, q[..., :H_CKV], q[..., H_CKV:]


def check_request(o, lse, q, kv_rows, qo_len, kv_len, causal, sm_scale, atol=2e-3):
    keys = kv_rows[:kv_len].double()
    o_ref, lse_ref = attention_ref(q, keys, keys[:, :H_CKV], qo_len, kv_len, causal, sm_scale)
    torch.testing.assert_close(o.double().cpu(), o_ref.cpu(), rtol=1e-3, atol=atol)
    if kv_len > 0 and lse is not None:
        torch.testing.assert_close(lse.double().cpu(), lse_ref.cpu(), rtol=1e-3, atol=atol)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["joined", "separate"])
@pytest.mark.parametrize("batch,qo_len,causal", [(1, 1, False), (2, 3, True), (3, 5, False)])
def test_varlen_batch_from_kv_len_arr(device, layout, batch, qo_len, causal):
    """FlashInfer's varlen test: three length groups per batch entry, kv_indptr built as a
    [batch + 1, 3] table flattened (3 (batch + 1) entries for 3 batch requests)."""
    gen = torch.Generator().manual_seed(batch * 7 + qo_len)
    groups = torch.tensor([11, 33, 79] if causal else [3, 33, 79], dtype=torch.int32)
    page_size, heads = 1, 16
    pages_nums = groups.tolist()
    pages_indptr = [0, pages_nums[0], pages_nums[0] + pages_nums[1], sum(pages_nums)]
    S = pages_indptr[-1]
    _, ckv, kpe = pool(batch * S, page_size, device, gen=gen, layout=layout)
    q, q_nope, q_pe = split_q(3 * batch * qo_len, heads, device, gen)
    kv_indptr = torch.cat([torch.arange(batch + 1).unsqueeze(-1).int() * S + pages_indptr[i]
                           for i in range(3)], dim=-1).flatten().to(device)
    kv_indices = torch.arange(batch * S, dtype=torch.int32, device=device)
    kv_lens = groups.repeat(batch).to(device)
    assert kv_indptr.shape[0] == 3 * (batch + 1)  # longer than 3 batch + 1: sliced by the adapter
    sm_scale = 1.0 / (192 ** 0.5)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8, device=device))
    w.plan(torch.arange(3 * batch + 1, dtype=torch.int32, device=device) * qo_len, kv_indptr, kv_indices,
           kv_lens, heads, H_CKV, H_KPE, page_size, causal, sm_scale, DTYPE, DTYPE)
    o, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    rows = torch.cat([ckv, kpe], -1).reshape(-1, H_CKV + H_KPE)
    for r in range(3 * batch):
        first = kv_indptr[r].item()
        check_request(o[r * qo_len:(r + 1) * qo_len], lse[r * qo_len:(r + 1) * qo_len],
                      q[r * qo_len:(r + 1) * qo_len], rows[first * page_size:], qo_len, groups[r % 3].item(),
                      causal, sm_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["joined", "separate"])
@pytest.mark.parametrize("kv_len,page_size", [(17, 16), (75, 32), (33, 16)])
def test_nan_past_each_length_is_not_read(device, layout, kv_len, page_size):
    gen = torch.Generator().manual_seed(kv_len)
    batch, qo_len, heads = 3, 3, 16
    pages_num = math.ceil(kv_len / page_size)
    kv = pool(batch * pages_num, page_size, device, gen=gen)[0]
    last = kv_len - (pages_num - 1) * page_size
    for i in range(batch):
        kv[(i + 1) * pages_num - 1, last:, :] = float("nan")
    ckv, kpe = parts(kv, layout)
    q, q_nope, q_pe = split_q(batch * qo_len, heads, device, gen)
    sm_scale = 1.0 / (192 ** 0.5)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8, device=device))
    w.plan(torch.arange(batch + 1, dtype=torch.int32, device=device) * qo_len,
           torch.arange(batch + 1, dtype=torch.int32, device=device) * pages_num,
           torch.arange(batch * pages_num, dtype=torch.int32, device=device),
           torch.full((batch,), kv_len, dtype=torch.int32, device=device), heads, H_CKV, H_KPE, page_size, True,
           sm_scale, DTYPE, DTYPE)
    o, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    assert not torch.isnan(o).any() and not torch.isnan(lse).any()
    for r in range(batch):
        rows = kv[r * pages_num:(r + 1) * pages_num].reshape(-1, H_CKV + H_KPE)
        check_request(o[r * qo_len:(r + 1) * qo_len], lse[r * qo_len:(r + 1) * qo_len],
                      q[r * qo_len:(r + 1) * qo_len], rows, qo_len, kv_len, True, sm_scale)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["joined", "separate"])
@pytest.mark.parametrize("kv_len", [0, 17, 96])
@pytest.mark.parametrize("page_size", [1, 16])
def test_page_attention_with_graph_buffers_and_caller_buffers(device, layout, kv_len, page_size):
    """FlashInfer's page-attention test: CUDA-graph buffers given to the constructor (longer than
    needed), kv_len 0 with a cache of no pages, then out= and lse= buffers (written in base 2,
    only out returned)."""
    gen = torch.Generator().manual_seed(kv_len + page_size)
    batch, qo_len, heads = 3, 1, 16
    pages_num = math.ceil(kv_len / page_size)
    _, ckv, kpe = pool(batch * pages_num, page_size, device, gen=gen, layout=layout)
    q, q_nope, q_pe = split_q(batch * qo_len, heads, device, gen)
    sm_scale = 1.0 / (192 ** 0.5)
    i32 = dict(dtype=torch.int32, device=device)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8, device=device), use_cuda_graph=True,
                                      qo_indptr=torch.empty(batch + 1, **i32), kv_indptr=torch.empty(batch + 1, **i32),
                                      kv_indices=torch.empty(4096, **i32), kv_len_arr=torch.empty(batch, **i32))
    w.plan(torch.arange(batch + 1, **i32) * qo_len, torch.arange(batch + 1, **i32) * pages_num,
           torch.arange(batch * pages_num, **i32), torch.full((batch,), kv_len, **i32), heads, H_CKV, H_KPE,
           page_size, False, sm_scale, DTYPE, DTYPE)
    o, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True)
    rows = torch.cat([ckv, kpe], -1)
    for r in range(batch):
        kv_rows = rows[r * pages_num:(r + 1) * pages_num].reshape(-1, H_CKV + H_KPE)
        check_request(o[r:r + 1], lse[r:r + 1], q[r:r + 1], kv_rows, qo_len, kv_len, False, sm_scale)
    if kv_len == 0:
        assert torch.all(o == 0) and torch.all(lse == -math.inf)
    o_buf = torch.full_like(o, math.nan)
    lse_buf = torch.full_like(lse, math.nan)
    res = w.run(q_nope, q_pe, ckv, kpe, out=o_buf, lse=lse_buf)
    assert res is o_buf
    torch.testing.assert_close(o_buf, o, rtol=0, atol=0)
    torch.testing.assert_close(lse_buf, lse, rtol=0, atol=0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ["joined", "separate"])
@pytest.mark.parametrize("ckv_scale,kpe_scale", [(0.02, 0.02), (0.02, 0.005)])
def test_fp8_keywords(device, layout, ckv_scale, kpe_scale):
    """run(ckv_scale=, kpe_scale=) on an fp8 pool: the same as the 16-bit run on the dequantised
    values (different scales fold the rotary scale into a copy of q_pe)."""
    gen = torch.Generator().manual_seed(5)
    batch, qo_len, heads, page_size, kv_len = 2, 2, 16, 16, 70
    pages = batch * math.ceil(kv_len / page_size)
    raw = (torch.rand(pages, page_size, H_CKV + H_KPE, generator=gen) * 400 - 200)
    kv8 = raw.to(torch.float8_e4m3fn).to(device)
    deq = kv8.float()
    deq[..., :H_CKV] *= ckv_scale
    deq[..., H_CKV:] *= kpe_scale
    kv16 = deq.to(torch.bfloat16)
    q = (torch.randn(batch * qo_len, heads, H_CKV + H_KPE, generator=gen) * 0.1).to(torch.bfloat16).to(device)
    i32 = dict(dtype=torch.int32, device=device)
    args = (torch.arange(batch + 1, **i32) * qo_len, torch.arange(batch + 1, **i32) * (pages // batch),
            torch.arange(pages, **i32), torch.full((batch,), kv_len, **i32), heads, H_CKV, H_KPE, page_size, True,
            1.0 / 24)
    w8 = BatchMLAPagedAttentionWrapper(None)
    w8.plan(*args, torch.bfloat16, torch.float8_e4m3fn)
    o8 = w8.run(q[..., :H_CKV], q[..., H_CKV:], *parts(kv8, layout), ckv_scale=ckv_scale,
                kpe_scale=kpe_scale)
    w16 = BatchMLAPagedAttentionWrapper(None)
    w16.plan(*args, torch.bfloat16, torch.bfloat16)
    o16 = w16.run(q[..., :H_CKV], q[..., H_CKV:], kv16[..., :H_CKV], kv16[..., H_CKV:])
    err = ((o8.float() - o16.float()).norm() / o16.float().norm()).item()
    assert err < 2e-2, err


def test_fp8_keywords_are_keyword_only_and_follow_flashinfer_rules():
    params = inspect.signature(BatchMLAPagedAttentionWrapper.run).parameters
    for name in ("ckv_scale", "kpe_scale", "ckv_scale_arr"):
        assert params[name].kind == inspect.Parameter.KEYWORD_ONLY
    i32 = dict(dtype=torch.int32)
    kv8 = torch.zeros(1, 64, 576).to(torch.float8_e4m3fn)
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16)
    w = BatchMLAPagedAttentionWrapper(None)
    w.plan(torch.tensor([0, 1], **i32), torch.tensor([0, 1], **i32), torch.tensor([0], **i32),
           torch.tensor([64], **i32), 16, 512, 64, 64, False, 1.0, torch.bfloat16, torch.float8_e4m3fn)
    views = (q[..., :512], q[..., 512:], kv8[..., :512], kv8[..., 512:])
    with pytest.raises(ValueError, match="Exactly one of ckv_scale or ckv_scale_arr"):
        w.run(*views)
    with pytest.raises(ValueError, match="Exactly one of ckv_scale or ckv_scale_arr"):
        w.run(*views, ckv_scale=1.0, ckv_scale_arr=torch.ones(1, 64, 4), kpe_scale=1.0)
    with pytest.raises(ValueError, match="Invalid shape of ckv_scale_arr"):
        w.run(*views, ckv_scale_arr=torch.ones(1, 64, 3), kpe_scale=1.0)
    with pytest.raises(mlakit.ArgumentError, match="per-group fp8 scales are not supported"):
        w.run(*views, ckv_scale_arr=torch.ones(1, 64, 4), kpe_scale=1.0)
    with pytest.raises(ValueError, match="kpe_scale is required"):
        w.run(*views, ckv_scale=1.0)
    with pytest.raises(ValueError, match=r"kpe_scale = nan: not in the supported domain"):
        w.run(*views, ckv_scale=1.0, kpe_scale=math.nan)
    with pytest.raises(ValueError, match="q_nope.dtype=torch.float16 does not match the planned q_data_type"):
        w.run(q[..., :512].half(), q[..., 512:], kv8[..., :512], kv8[..., 512:], ckv_scale=1.0, kpe_scale=1.0)
    with pytest.raises(ValueError, match="kpe_cache.dtype=torch.bfloat16 does not match"):
        w.run(q[..., :512], q[..., 512:], kv8[..., :512], kv8[..., 512:].bfloat16(), ckv_scale=1.0, kpe_scale=1.0)
    w.run(*views, ckv_scale=1.0, kpe_scale=1.0)  # accepted
    w16 = BatchMLAPagedAttentionWrapper(None)
    w16.plan(torch.tensor([0, 1], **i32), torch.tensor([0, 1], **i32), torch.tensor([0], **i32),
             torch.tensor([64], **i32), 16, 512, 64, 64, False, 1.0, torch.bfloat16, torch.bfloat16)
    kv16 = torch.zeros(1, 64, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="only valid when kv_data_type is FP8"):
        w16.run(q[..., :512], q[..., 512:], kv16[..., :512], kv16[..., 512:], ckv_scale=1.0)


def test_outside_the_domain_rejected_with_a_clear_error():
    i32 = dict(dtype=torch.int32)
    w = BatchMLAPagedAttentionWrapper(None)
    plan = (torch.tensor([0, 1, 2], **i32), torch.tensor([0, 1, 2], **i32), torch.tensor([0, 1], **i32),
            torch.tensor([5, 5], **i32), 16)
    with pytest.raises(mlakit.ArgumentError, match=r"head_dim_kpe = 0: not in the supported domain \(512 and 64"):
        w.plan(*plan, 512, 0, 16, False, 1.0, DTYPE, DTYPE)
    with pytest.raises(mlakit.ArgumentError, match=r"kv_indptr has 2 entries: at least batch \+ 1 = 3"):
        w.plan(plan[0], torch.tensor([0, 1], **i32), *plan[2:], 512, 64, 16, False, 1.0, DTYPE, DTYPE)
    w.plan(*plan, 512, 64, 16, False, 1.0, DTYPE, DTYPE)
    q = torch.zeros(2, 16, 576, dtype=DTYPE)
    ckv, kpe = torch.zeros(2, 16, 512, dtype=DTYPE), torch.zeros(2, 16, 64, dtype=DTYPE)
    with pytest.raises(mlakit.ArgumentError, match=r"ckv_cache \[2, 16, 512\] and kpe_cache \[2, 16, 32\]: "
                                                   r"expected last dimensions 512 and 64"):
        w.run(q[..., :512], q[..., 512:], ckv, kpe[..., :32])
    with pytest.raises(mlakit.ArgumentError, match=r"kv_rope has shape \[3, 16, 64\]: expected \[2, 16, 64\]"):
        w.run(q[..., :512], q[..., 512:], ckv, torch.zeros(3, 16, 64, dtype=DTYPE))
    q3 = torch.zeros(3, 16, 576, dtype=DTYPE)
    with pytest.raises(mlakit.ArgumentError, match="3 query tokens for 2 requests"):
        kv = torch.zeros(2, 16, 576, dtype=DTYPE)
        w.run(q3[..., :512], q3[..., 512:], kv[..., :512], kv[..., 512:])
