"""GPU tests of torch.ops.mlakit.decode against the float32 reference (mlakit.reference).
Skipped without a CUDA GPU; with a GPU they fail if the extension was not built."""
import math

import pytest
import torch

import mlakit
from cases import make_case, page_ids, reference, rel_l2

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SCALE = 576 ** -0.5
F8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
PAIRS = [(q, kv) for q in (torch.bfloat16, torch.float16)
         for kv in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)]
# Relative L2 error of O against the float32 reference: output rounding (bf16 2^-9, fp16 2^-12
# per element) plus the kernels' 16-bit P; a wrong mask, page or scale gives errors near 1.
O_TOL = {torch.bfloat16: 1e-2, torch.float16: 4e-3}
# LSE: the reference reads the cache values exactly; the converting instantiations round a
# 16-bit cache to Q's type (bf16 Q, fp16 cache: ~1e-3 per score), exact ones are near 1e-6.
LSE_TOL = 4e-3


@pytest.fixture(scope="module", autouse=True)
def extension():
    assert mlakit.has_cuda_extension(), f"a GPU is present but mlakit._C did not load: {mlakit._ext.LOAD_ERROR}"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    yield


def name(d):
    return str(d).replace("torch.", "")


def run(case, kind="table", **kw):
    return mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], **page_ids(case, kind),
                         softmax_scale=kw.pop("softmax_scale", SCALE), return_lse=True, **kw)


def check(case, out, lse, kind="table", causal=True, kv_scale=1.0, softmax_scale=SCALE, lse_tol=LSE_TOL):
    torch.cuda.synchronize()
    ref_out, ref_lse = reference(case, kind, softmax_scale=softmax_scale, kv_scale=kv_scale, causal=causal)
    seen = torch.isfinite(ref_lse)
    # rows that see no key: O = 0 and LSE = -inf exactly
    assert torch.equal(torch.isfinite(lse), seen), "rows with and without keys differ from the reference"
    assert torch.all(lse[~seen] == -math.inf)
    assert torch.all(out[~seen] == 0)
    if seen.any():
        err = rel_l2(out[seen].float(), ref_out[seen])
        assert err < O_TOL[out.dtype], f"O relative L2 error {err:.3g}"
        lse_err = (lse[seen] - ref_lse[seen]).abs().max().item()
        assert lse_err < lse_tol, f"LSE max abs error {lse_err:.3g}"


@pytest.mark.parametrize("page_size", [1, 64])
@pytest.mark.parametrize("heads", [12, 16, 128])
@pytest.mark.parametrize("q_dtype,kv_dtype", PAIRS, ids=[f"{name(q)}-{name(k)}" for q, k in PAIRS])
def test_dtype_pairs(q_dtype, kv_dtype, heads, page_size):
    kind = "csr" if page_size == 1 else "table"
    kv_scale = 0.5 if kv_dtype in F8 else 1.0
    case = make_case(batch=3, q_len=4, heads=heads, q_dtype=q_dtype, kv_dtype=kv_dtype,
                     page_size=page_size, kv_lens=(0, 37, 300), device="cuda", seed=heads + page_size)
    out, lse = run(case, kind, kv_scale=kv_scale)
    check(case, out, lse, kind, kv_scale=kv_scale)


@pytest.mark.parametrize("q_len", range(1, 33))
def test_every_q_len_bf16_fp8(q_len):
    case = make_case(batch=3, q_len=q_len, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(5, 100, 777), device="cuda", seed=q_len)
    out, lse = run(case, kv_scale=0.25)
    check(case, out, lse, kv_scale=0.25)


@pytest.mark.parametrize("q_len", [1, 2, 3, 7, 16, 31, 32])
def test_q_len_fp16_page1_csr(q_len):
    case = make_case(batch=2, q_len=q_len, heads=12, q_dtype=torch.float16, kv_dtype=torch.float16,
                     page_size=1, kv_lens=(40, 129), device="cuda", seed=100 + q_len)
    out, lse = run(case, "csr")
    check(case, out, lse, "csr")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_causal_and_not(causal, kv_dtype):
    case = make_case(batch=3, q_len=8, heads=16, kv_dtype=kv_dtype, page_size=16, kv_lens=(3, 8, 200),
                     device="cuda", seed=7)
    out, lse = run(case, causal=causal)
    check(case, out, lse, causal=causal)


def test_all_lengths_zero():
    case = make_case(batch=4, q_len=2, heads=16, page_size=64, kv_lens=(0, 0, 0, 0), device="cuda")
    out, lse = run(case)
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_empty_batch():
    case = make_case(batch=0, q_len=2, heads=16, page_size=64, kv_lens=(), device="cuda")
    out, lse = run(case)
    assert out.shape == (0, 2, 16, 512)


@pytest.mark.parametrize("split,num_splits", [("auto", 0), ("none", 0), ("fixed", 1), ("fixed", 3), ("fixed", 64)])
def test_split_modes(split, num_splits):
    case = make_case(batch=3, q_len=2, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(1, 2000, 4097), device="cuda", seed=3)
    out, lse = run(case, split=split, num_splits=num_splits)
    check(case, out, lse)


@pytest.mark.parametrize("split,num_splits", [("none", 0), ("fixed", 3)])
def test_lse_formats_written_by_the_kernels(split, num_splits):
    # Rows without keys (kv_len 0) and, with fixed splits, rows whose LSE the combine writes.
    case = make_case(batch=3, q_len=2, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(0, 700, 3000), device="cuda", seed=11)
    out, lse = run(case, split=split, num_splits=num_splits)
    check(case, out, lse)
    out_b2, lse_b2 = run(case, split=split, num_splits=num_splits, lse_format="base2")
    out_inf, lse_inf = run(case, split=split, num_splits=num_splits, lse_format="natural_empty_is_inf")
    torch.cuda.synchronize()
    assert torch.equal(out_b2, out) and torch.equal(out_inf, out)
    # base 2: the natural log times log2(e) in float32, the same rounding as FlashInfer's own
    # conversion; -inf stays -inf.
    assert torch.equal(lse_b2, lse * (1.0 / math.log(2.0)))
    empty = lse == -math.inf
    assert empty.any() and torch.all(lse_inf[empty] == math.inf)
    assert torch.equal(lse_inf[~empty], lse[~empty])


def test_many_requests():
    g = torch.Generator().manual_seed(5)
    lens = torch.randint(0, 400, (200,), generator=g).tolist()
    case = make_case(batch=200, q_len=2, heads=16, page_size=16, kv_lens=lens, device="cuda", seed=5)
    out, lse = run(case, "csr")
    check(case, out, lse, "csr")


def test_repeatable_bitwise():
    case = make_case(batch=3, q_len=4, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(10, 3000, 900), device="cuda", seed=9)
    a = run(case)
    b = run(case)
    torch.cuda.synchronize()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_runs_on_the_current_stream():
    case = make_case(batch=3, q_len=4, heads=16, page_size=64, kv_lens=(10, 300, 900), device="cuda", seed=11)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        out, lse = run(case)
    torch.cuda.current_stream().wait_stream(s)
    check(case, out, lse)


# ---- strides from the tensors ------------------------------------------------------------------

def test_strided_views():
    case = make_case(batch=3, q_len=4, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(0, 37, 300), device="cuda", seed=13)
    qw = torch.zeros(3, 4, 16, 640, dtype=torch.bfloat16, device="cuda")
    qw[..., :576] = case["q"]
    kvw = torch.zeros(case["kv_cache"].shape[:2] + (1, 704), dtype=torch.uint8, device="cuda").view(torch.float8_e4m3fn)
    kvw[:, :, 0, :576] = case["kv_cache"]
    ow = torch.zeros(3, 4, 16, 600, dtype=torch.bfloat16, device="cuda")
    lw = torch.zeros(3, 4, 19, device="cuda")
    # the batch dimension of the table is a strided view too
    bt = torch.zeros(6, case["block_table"].shape[1], dtype=torch.int32, device="cuda")
    bt[::2] = case["block_table"]
    mlakit.decode(qw[..., :576], kvw[..., :576], case["kv_len"], block_table=bt[::2], softmax_scale=SCALE,
                  out=ow[..., :512], lse=lw[..., :16], kv_scale=0.5)
    check(case, ow[..., :512], lw[..., :16], kv_scale=0.5)
    assert torch.all(ow[..., 512:] == 0) and torch.all(lw[..., 16:] == 0), "wrote outside the views"


def test_misaligned_stride_rejected_by_the_library():
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    qw = torch.zeros(2, 2, 16, 580, dtype=torch.bfloat16, device="cuda")
    with pytest.raises(mlakit.ArgumentError, match=r"q_stride_head = 580: not in the supported domain "
                                                   r"\(at least 576 elements, a multiple of 8, at most \d+\)"):
        mlakit.decode(qw[..., :576], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                      softmax_scale=SCALE)


@pytest.mark.parametrize("q_len", [2, 5])
def test_lse_in_flashmla_layout_written_in_place(q_len):
    case = make_case(batch=3, q_len=q_len, heads=16, page_size=64, kv_lens=(0, 5, 300), device="cuda", seed=q_len)
    wide = torch.full((3, 17, q_len + 1), math.nan, device="cuda")  # [b, h, s] with padding
    lse = wide[:, :16, :q_len].transpose(1, 2)  # its [b, s, h] view: token stride 1
    out, _ = run(case, lse=lse)
    check(case, out, lse)
    assert torch.isnan(wide[:, 16]).all() and torch.isnan(wide[:, :, q_len]).all(), "wrote outside the view"


def test_overlapping_lse_rejected_by_the_library():
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    lse = torch.empty(2, 16 + 1, device="cuda").unsqueeze(1).expand(2, 2, 17)[..., :16]  # tokens share rows
    with pytest.raises(mlakit.ArgumentError, match=r"lse_stride_token = 0: not in the supported domain"):
        run(case, lse=lse)


# ---- errors from the library's Status ----------------------------------------------------------

def direct(case, **kw):
    """mlakit._C.decode without the Python checks: the library's own validation answers."""
    q = kw.get("q", case["q"])
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype, device=q.device)
    ws = mlakit.workspace(1, 16, 1)
    return mlakit._ext._C.decode(q, kw.get("kv_cache", case["kv_cache"]), case["block_table"], None, None,
                                 case["kv_len"], out, None, ws, SCALE, 1.0, True,
                                 kw.get("split", 0), kw.get("num_splits", 0), kw.get("lse_format", 0))


def python_message(case, **kw):
    q = kw.get("q", case["q"])
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype, device=q.device)
    split = {0: "auto", 2: "fixed"}[kw.get("split", 0)]
    with pytest.raises(mlakit.ArgumentError) as e:
        mlakit._checks.check_decode_args(q, kw.get("kv_cache", case["kv_cache"]), case["block_table"], None,
                                         None, case["kv_len"], out, None, SCALE, 1.0, True, split,
                                         kw.get("num_splits", 0), None)
    return str(e.value)


@pytest.mark.parametrize("what", ["q_len 33", "129 heads", "page 300", "65 splits"])
def test_library_and_python_checks_agree(what):
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    kw = {
        "q_len 33": dict(q=torch.zeros(2, 33, 16, 576, dtype=torch.bfloat16, device="cuda")),
        "129 heads": dict(q=torch.zeros(2, 2, 129, 576, dtype=torch.bfloat16, device="cuda")),
        "page 300": dict(kv_cache=torch.zeros(2, 300, 576, dtype=torch.bfloat16, device="cuda")),
        "65 splits": dict(split=2, num_splits=65),
    }[what]
    code, code_name, message = direct(case, **kw)
    assert code_name == "invalid_argument" and code != 0
    assert message == python_message(case, **kw)


def test_binding_rejects_cpu_tensor_without_crashing():
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    code, code_name, message = direct(case, kv_cache=case["kv_cache"].cpu())
    assert code_name == "invalid_argument" and "kv_cache: must be a CUDA tensor" in message


def test_workspace_too_small_is_an_exception():
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    with pytest.raises(mlakit.Error, match=r"workspace_bytes = 1: need \d+") as e:
        run(case, workspace=torch.empty(1, dtype=torch.uint8, device="cuda"))
    assert e.value.code == "workspace_too_small"


def test_mixed_devices_rejected():
    case = make_case(batch=2, q_len=2, heads=16, page_size=64, kv_lens=(5, 50), device="cuda")
    case["kv_len"] = case["kv_len"].cpu()
    with pytest.raises(mlakit.ArgumentError, match=r"kv_len is on cpu, q on cuda:0"):
        run(case)


# ---- adapters ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_flashmla_adapter(kv_dtype):
    from mlakit import flashmla
    case = make_case(batch=4, q_len=2, heads=16, kv_dtype=kv_dtype, page_size=64, kv_lens=(0, 1, 64, 1000),
                     device="cuda", seed=17)
    q = case["q"]
    meta, num_splits = flashmla.get_mla_metadata(case["kv_len"], q.shape[1] * q.shape[2], 1)
    assert meta.workspace is not None
    out, lse = flashmla.flash_mla_with_kvcache(q, case["kv_cache"].unsqueeze(2), case["block_table"],
                                               case["kv_len"], 512, meta, num_splits, causal=True,
                                               descale_k=torch.tensor([0.5]))
    lse_bsh = lse.transpose(1, 2).clone()
    assert torch.all(lse_bsh[0] == math.inf)
    lse_bsh[lse_bsh == math.inf] = -math.inf
    check(case, out, lse_bsh, kv_scale=0.5)


def test_flashinfer_adapter_sglang_views():
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case = make_case(batch=3, q_len=1, heads=16, page_size=1, kv_lens=(7, 300, 0), device="cuda", seed=19)
    kv = case["kv_cache"]  # SGLang's MLA pool: [tokens, 1, 576]; FlashInfer gets its two parts
    q = case["q"].reshape(3, 16, 576)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8, device="cuda"))
    qo_indptr = torch.arange(4, dtype=torch.int32, device="cuda")
    w.plan(qo_indptr, case["kv_indptr"], case["kv_indices"], case["kv_len"], 16, 512, 64, 1, False,
           SCALE, torch.bfloat16, torch.bfloat16)
    out, lse = w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], return_lse=True,
                     return_lse_base_on_e=True)
    assert out.shape == (3, 16, 512) and lse.shape == (3, 16)
    check(case, out.view(3, 1, 16, 512), lse.view(3, 1, 16), "csr", causal=False)


# ---- a separate rotary cache (kv_rope) ----------------------------------------------------------

def rope_parts(kv, layout):
    """The latent and rotary parts of a [pages, page_size, 576] cache as two tensors of their own:
    packed ("packed": [pages, page_size, 512] and [pages, page_size, 64]) or as views into wider
    rows ("padded": rows of 640 and 128 values, so every stride differs from the joined one)."""
    if layout == "packed":
        return kv[..., :512].clone(), kv[..., 512:].clone()
    pages, page_size = kv.shape[0], kv.shape[1]
    latent = torch.zeros(pages, page_size, 640, dtype=kv.dtype, device=kv.device)[..., :512]
    rope = torch.zeros(pages, page_size, 128, dtype=kv.dtype, device=kv.device)[..., 64:]
    latent.copy_(kv[..., :512])
    rope.copy_(kv[..., 512:])
    return latent, rope


SEPARATE = [  # q_len, heads, kv dtype, page size, split, layout: each kernel family and form
    (1, 16, torch.bfloat16, 64, "auto", "packed"), (8, 16, torch.bfloat16, 64, "auto", "padded"),
    (8, 16, torch.float8_e4m3fn, 64, "auto", "packed"), (4, 16, torch.float8_e4m3fn, 1, "fixed", "padded"),
    (2, 128, torch.bfloat16, 16, "none", "packed"), (32, 16, torch.float8_e4m3fn, 64, "auto", "padded"),
    (3, 12, torch.float16, 1, "auto", "padded"), (1, 1, torch.float8_e4m3fnuz, 256, "fixed", "packed"),
    (16, 128, torch.bfloat16, 64, "auto", "padded"), (5, 8, torch.float8_e4m3fn, 16, "none", "packed"),
]


@pytest.mark.parametrize("q_len,heads,kv_dtype,page_size,split,layout", SEPARATE)
@pytest.mark.parametrize("q_dtype", [torch.bfloat16, torch.float16])
def test_separate_rope_cache_equals_joined_bitwise(q_len, heads, kv_dtype, page_size, split, layout, q_dtype):
    """kv_cache [pages, P, 512] with kv_rope [pages, P, 64] holds the same values as the joined
    cache: the kernels read the same values from other addresses, so O and LSE are bitwise
    equal, and they match the reference."""
    case = make_case(batch=3, q_len=q_len, heads=heads, q_dtype=q_dtype, kv_dtype=kv_dtype,
                     page_size=page_size, kv_lens=(q_len, 37, 700), device="cuda", seed=q_len * 131 + heads)
    kv_scale = 0.5 if kv_dtype in F8 else 1.0
    num_splits = 3 if split == "fixed" else 0
    out, lse = run(case, kv_scale=kv_scale, split=split, num_splits=num_splits)
    latent, rope = rope_parts(case["kv_cache"], layout)
    out2 = torch.full_like(out, math.nan)
    lse2 = torch.full_like(lse, math.nan)
    mlakit.decode(case["q"], latent, case["kv_len"], **page_ids(case, "table"), softmax_scale=SCALE,
                  kv_scale=kv_scale, split=split, num_splits=num_splits, out=out2, lse=lse2, kv_rope=rope)
    torch.cuda.synchronize()
    assert torch.equal(out2, out) and torch.equal(lse2, lse)
    # A 16-bit cache of the other type is rounded to Q's type: 5e-3, as the C++ suite allows.
    converted = kv_dtype not in F8 and kv_dtype != q_dtype
    check(case, out2, lse2, kv_scale=kv_scale, lse_tol=5e-3 if converted else LSE_TOL)


def test_separate_rope_cache_is_read():
    """The rotary values come from kv_rope, not from past the latent values: changing them changes
    the result as the reference says."""
    case = make_case(batch=2, q_len=8, heads=16, kv_dtype=torch.float8_e4m3fn, kv_lens=(8, 300),
                     device="cuda", seed=3)
    latent, rope = rope_parts(case["kv_cache"], "packed")
    rope.mul_(-1) if rope.element_size() > 1 else rope.view(torch.uint8).bitwise_xor_(0x80)
    out, lse = mlakit.decode(case["q"], latent, case["kv_len"], block_table=case["block_table"],
                             softmax_scale=SCALE, return_lse=True, kv_rope=rope)
    ref_out, ref_lse = mlakit.decode_reference(case["q"], latent, case["kv_len"], block_table=case["block_table"],
                                               softmax_scale=SCALE, kv_rope=rope)
    joined_ref, _ = reference(case, "table", softmax_scale=SCALE)
    assert rel_l2(out.float(), ref_out) < O_TOL[out.dtype]
    assert rel_l2(ref_out, joined_ref) > 0.1  # the sign flip matters: the test can fail
