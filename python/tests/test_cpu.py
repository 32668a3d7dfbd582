"""CPU-side tests of the torch op: schema, fake (meta) implementation, torch.compile tracing,
argument errors, the float32 reference and the adapters' layouts. They need neither a GPU
nor the compiled extension (the op's CPU implementation is the reference)."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mlakit
import mlakit._op
from cases import make_case, page_ids, reference, rel_l2

SCALE = 576 ** -0.5


def call_op(case, kind="table", lse=True, **kw):
    q = case["q"]
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype, device=q.device)
    l = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device) if lse else None
    ids = page_ids(case, kind)
    torch.ops.mlakit.decode(q, case["kv_cache"], ids.get("block_table"), ids.get("kv_indptr"),
                            ids.get("kv_indices"), case["kv_len"], out, l, kw.pop("softmax_scale", SCALE), **kw)
    return out, l


# ---- schema ------------------------------------------------------------------------------------

def test_schema():
    schema = torch.ops.mlakit.decode.default._schema
    names = [a.name for a in schema.arguments]
    assert names == ["q", "kv_cache", "block_table", "kv_indptr", "kv_indices", "kv_len", "out", "lse",
                     "softmax_scale", "kv_scale", "causal", "split_mode", "num_splits", "workspace",
                     "lse_format", "kv_rope", "plan_step", "compute"]
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "lse", "workspace"]
    assert len(schema.returns) == 0
    defaults = {a.name: a.default_value for a in schema.arguments if a.has_default_value()}
    assert defaults == {"kv_scale": 1.0, "causal": True, "split_mode": "auto", "num_splits": 0, "workspace": None,
                        "lse_format": "natural", "kv_rope": None, "plan_step": "plan_and_decode",
                        "compute": "standard"}


# ---- fake implementation -----------------------------------------------------------------------

def fake_inputs(batch=2, q_len=3, heads=16, pages=10, page_size=64):
    return dict(
        q=torch.empty(batch, q_len, heads, 576, dtype=torch.bfloat16),
        kv_cache=torch.empty(pages, page_size, 576, dtype=torch.float8_e4m3fn),
        kv_len=torch.empty(batch, dtype=torch.int32),
        block_table=torch.empty(batch, 4, dtype=torch.int32),
    )


def test_fake_impl_gives_shapes_without_running(monkeypatch):
    calls = []
    monkeypatch.setattr(mlakit._op, "decode_reference", lambda *a, **k: calls.append(1))
    with FakeTensorMode():
        t = fake_inputs()
        out, lse = mlakit.decode(t["q"], t["kv_cache"], t["kv_len"], block_table=t["block_table"],
                                 softmax_scale=SCALE, return_lse=True)
        assert out.shape == (2, 3, 16, 512) and out.dtype == torch.bfloat16
        assert lse.shape == (2, 3, 16) and lse.dtype == torch.float32
    assert calls == []


def test_fake_impl_checks_arguments():
    with FakeTensorMode():
        t = fake_inputs(q_len=40)
        with pytest.raises(mlakit.ArgumentError, match=r"q_len = 40: not in the supported domain \(allowed 1..32\)"):
            mlakit.decode(t["q"], t["kv_cache"], t["kv_len"], block_table=t["block_table"], softmax_scale=SCALE)


def test_meta_tensors():
    t = {k: v.to("meta") for k, v in make_case().items()}
    out = mlakit.decode(t["q"], t["kv_cache"], t["kv_len"], block_table=t["block_table"], softmax_scale=SCALE)
    assert out.device.type == "meta" and out.shape == (3, 4, 16, 512)


# ---- torch.compile -----------------------------------------------------------------------------

class Attention(torch.nn.Module):
    def forward(self, q, kv_cache, kv_len, block_table):
        out, lse = mlakit.decode(q, kv_cache, kv_len, block_table=block_table, softmax_scale=SCALE,
                                 return_lse=True)
        return out.float() * 2.0, lse


def test_compile_fullgraph_traces_the_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    case = make_case(batch=2, kv_lens=(5, 70), q_len=2, heads=4)
    args = (case["q"], case["kv_cache"], case["kv_len"], case["block_table"])
    compiled = torch.compile(Attention(), backend=backend, fullgraph=True)
    out, lse = compiled(*args)
    assert len(graphs) == 1
    assert "mlakit.decode" in graphs[0].code
    ref_out, ref_lse = Attention()(*args)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)


def test_compile_aot_eager_functionalizes():
    case = make_case(batch=2, kv_lens=(5, 70), q_len=2, heads=4)
    args = (case["q"], case["kv_cache"], case["kv_len"], case["block_table"])
    out, lse = torch.compile(Attention(), backend="aot_eager", fullgraph=True)(*args)
    ref_out, ref_lse = Attention()(*args)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)


def test_make_fx_fake_trace_calls_no_kernel(monkeypatch):
    from torch.fx.experimental.proxy_tensor import make_fx
    calls = []
    monkeypatch.setattr(mlakit._op, "decode_reference", lambda *a, **k: calls.append(1))
    case = make_case(batch=2, kv_lens=(5, 70), q_len=2, heads=4)
    gm = make_fx(Attention(), tracing_mode="fake")(case["q"], case["kv_cache"], case["kv_len"], case["block_table"])
    assert "mlakit.decode" in gm.code
    assert calls == []


def test_opcheck():
    case = make_case(batch=2, kv_lens=(0, 70), q_len=2, heads=4, page_size=16)
    q = case["q"]
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype)
    lse = torch.empty(q.shape[:3], dtype=torch.float32)
    args = (q, case["kv_cache"], case["block_table"], None, None, case["kv_len"], out, lse, SCALE)
    torch.library.opcheck(torch.ops.mlakit.decode.default, args, {"kv_scale": 1.0, "causal": True})


# ---- the reference -----------------------------------------------------------------------------

def naive(q, kv, pages, length, page_size, scale, kv_scale, causal):
    """One request, float64, one row at a time."""
    q_len, heads, _ = q.shape
    keys = [kv[pages[j // page_size], j % page_size].double() * kv_scale for j in range(length)]
    out = torch.zeros(q_len, heads, 512, dtype=torch.float64)
    lse = torch.full((q_len, heads), -math.inf, dtype=torch.float64)
    for t in range(q_len):
        visible = [j for j in range(length) if not causal or j <= length - q_len + t]
        if not visible:
            continue
        for h in range(heads):
            s = torch.stack([q[t, h].double() @ keys[j] for j in visible]) * scale
            m = s.max()
            p = torch.exp(s - m)
            lse[t, h] = m + torch.log(p.sum())
            out[t, h] = sum(p[i] * keys[j][:512] for i, j in enumerate(visible)) / p.sum()
    return out, lse


@pytest.mark.parametrize("kind", ["table", "csr"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_reference_matches_naive_loop(kind, causal, kv_dtype):
    page_size = 4
    # lengths: empty, shorter than q_len, full pages, negative (counts as 0), past the capacity
    # (clamped: to the block table's width of 3 pages, or to the request's 2 CSR pages)
    case = make_case(batch=5, q_len=3, heads=2, kv_dtype=kv_dtype, page_size=page_size,
                     kv_lens=(0, 2, 9, -4, 7), extra_pages=0)
    case["kv_len"][4] = 100
    out, lse = reference(case, kind, softmax_scale=0.07, kv_scale=0.5, causal=causal)
    if kind == "table":
        pages = case["block_table"].tolist()
        lengths = [0, 2, 9, 0, 12]
    else:
        ptr, idx = case["kv_indptr"].tolist(), case["kv_indices"].tolist()
        pages = [idx[ptr[b]:ptr[b + 1]] for b in range(5)]
        lengths = [0, 2, 9, 0, 8]
    for b, n in enumerate(lengths):
        o, l = naive(case["q"][b], case["kv_cache"], pages[b], n, page_size, 0.07, 0.5, causal)
        if o.abs().sum() > 0:
            assert rel_l2(out[b], o) < 1e-5
        else:
            assert torch.equal(out[b], o.float())
        torch.testing.assert_close(lse[b], l.float(), atol=1e-5, rtol=1e-5)


def test_empty_batch_and_empty_lengths():
    case = make_case(batch=0, kv_lens=())
    out, lse = call_op(case)
    assert out.shape == (0, 4, 16, 512) and lse.shape == (0, 4, 16)
    case = make_case(batch=2, kv_lens=(0, 0), page_size=8)
    out, lse = call_op(case, "csr")
    assert torch.all(out == 0) and torch.all(lse == -math.inf)


def test_block_table_and_csr_agree():
    case = make_case(page_size=16, kv_lens=(0, 37, 300))
    a = reference(case, "table", softmax_scale=SCALE)
    b = reference(case, "csr", softmax_scale=SCALE)
    torch.testing.assert_close(a, b)


def test_cpu_op_is_the_reference():
    case = make_case(q_dtype=torch.float16, kv_dtype=torch.float8_e4m3fnuz, page_size=8)
    out, lse = call_op(case, "csr", kv_scale=0.25)
    ref_out, ref_lse = reference(case, "csr", softmax_scale=SCALE, kv_scale=0.25)
    torch.testing.assert_close(out, ref_out.half())
    torch.testing.assert_close(lse, ref_lse)
    assert torch.all(lse[0] == -math.inf) and torch.all(out[0] == 0)
    # The other LSE formats: FlashMLA's +inf for a row without keys, FlashInfer's base 2.
    _, lse_inf = call_op(case, "csr", kv_scale=0.25, lse_format="natural_empty_is_inf")
    assert torch.all(lse_inf[0] == math.inf) and torch.equal(lse_inf[1:], lse[1:])
    _, lse_b2 = call_op(case, "csr", kv_scale=0.25, lse_format="base2")
    torch.testing.assert_close(lse_b2, lse / math.log(2.0))


def test_cpu_op_plan_steps():
    """On the CPU (the reference, which has no plan) plan_only writes nothing and decode_only
    decodes."""
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16)
    out_ref, lse_ref = call_op(case, "table")
    out, lse = call_op(case, "table", plan_step="decode_only")
    assert torch.equal(out, out_ref) and torch.equal(lse, lse_ref)
    out, lse = torch.full_like(out_ref, math.nan), torch.full_like(lse_ref, math.nan)
    torch.ops.mlakit.decode(case["q"], case["kv_cache"], case["block_table"], None, None, case["kv_len"], out,
                            lse, SCALE, plan_step="plan_only")
    assert torch.all(torch.isnan(out)) and torch.all(torch.isnan(lse))


def test_cpu_op_fp8_matrix_mode_computes_the_reference():
    """compute="fp8_matrix" is accepted with a float8_e4m3fn cache; on the CPU the op computes
    the reference either way (the mode's own error is the CUDA kernel's, tested on the GPU)."""
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16,
                     kv_dtype=torch.float8_e4m3fn)
    out_ref, lse_ref = call_op(case, "table")
    out, lse = call_op(case, "csr", compute="fp8_matrix")
    assert torch.equal(out, out_ref) and torch.equal(lse, lse_ref)
    out = mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                        softmax_scale=SCALE, compute="fp8_matrix")
    assert torch.equal(out, out_ref)


def test_plan_record_follows_shape_lengths_and_capture(monkeypatch):
    """The host-side record of which plan a workspace holds (what decode_only and the adapters
    rely on): a call may reuse it only with the same shape, split mode and kv_len tensor at the
    same version, in the same capture (or both outside one)."""
    from mlakit import _workspace
    monkeypatch.setattr(_workspace, "_capture_id", lambda device: 0)
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16)
    ws = torch.empty(64, dtype=torch.uint8)

    def key(split=0, kv_len=None, q=None, table=None):
        return _workspace.plan_key(case["q"] if q is None else q, case["kv_cache"],
                                   case["block_table"] if table is None else table, None,
                                   case["kv_len"] if kv_len is None else kv_len, True, split, 0, None)
    k = key()
    assert _workspace.step_for(ws, k, True) == "plan_and_decode"  # nothing recorded yet
    _workspace.note_plan(ws, k)
    assert _workspace.step_for(ws, key(), True) == "decode_only"
    assert _workspace.step_for(ws, k, False) == "plan_and_decode"  # the caller's first layer
    assert _workspace.step_for(ws, key(q=case["q"].clone()), True) == "decode_only"  # other Q data
    assert _workspace.step_for(ws, key(split=1), True) == "plan_and_decode"
    assert _workspace.step_for(ws, key(q=case["q"][:1]), True) == "plan_and_decode"  # another batch
    assert _workspace.step_for(ws, key(kv_len=case["kv_len"].clone()), True) == "plan_and_decode"
    wider = torch.zeros(2, case["block_table"].shape[1] + 1, dtype=torch.int32)
    assert _workspace.step_for(ws, key(table=wider), True) == "plan_and_decode"  # other capacities
    monkeypatch.setattr(_workspace, "_capture_id", lambda device: 7)  # inside a capture
    assert _workspace.plan_in(ws) is None
    monkeypatch.setattr(_workspace, "_capture_id", lambda device: 0)
    case["kv_len"].add_(0)  # rewritten in place: a new version
    assert _workspace.step_for(ws, key(), True) == "plan_and_decode"
    _workspace.note_plan(ws, None)
    assert _workspace.plan_in(ws) is None
    # Tensors made under torch.inference_mode (as serving engines make them) keep no version:
    # the record takes them by address and layout.
    with torch.inference_mode():
        lens = case["kv_len"].clone()
    k = key(kv_len=lens)
    _workspace.note_plan(ws, k)
    assert _workspace.step_for(ws, key(kv_len=lens), True) == "decode_only"
    _workspace.note_plan(ws, None)


def test_flashmla_scale_tensor_made_in_inference_mode():
    from mlakit import flashmla
    with torch.inference_mode():
        scale = torch.tensor([0.25])
    assert flashmla._scale_value("descale_k", scale) == 0.25
    assert flashmla._scale_value("descale_k", scale) == 0.25  # the cached value


# ---- argument errors ---------------------------------------------------------------------------

def base_args():
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16)
    q = case["q"]
    return dict(q=q, kv_cache=case["kv_cache"], block_table=case["block_table"], kv_indptr=None,
                kv_indices=None, kv_len=case["kv_len"],
                out=torch.empty(q.shape[:3] + (512,), dtype=q.dtype),
                lse=torch.empty(q.shape[:3], dtype=torch.float32), softmax_scale=SCALE)


def _set(**changes):
    def f(a):
        a.update({k: (v(a) if callable(v) else v) for k, v in changes.items()})
    return f


BAD = [
    ("q_len 40", _set(q=lambda a: torch.zeros(2, 40, 4, 576, dtype=torch.bfloat16),
                      out=lambda a: torch.empty(2, 40, 4, 512, dtype=torch.bfloat16),
                      lse=None), r"q_len = 40: not in the supported domain \(allowed 1..32\)"),
    ("129 heads", _set(q=lambda a: torch.zeros(2, 2, 129, 576, dtype=torch.bfloat16),
                       out=lambda a: torch.empty(2, 2, 129, 512, dtype=torch.bfloat16),
                       lse=None), r"num_heads = 129: not in the supported domain \(allowed 1..128\)"),
    ("fp32 q", _set(q=lambda a: a["q"].float()), r"q: dtype torch.float32 is not supported"),
    ("q dim 512", _set(q=lambda a: a["q"][..., :512]), r"q has shape \[2, 2, 4, 512\]"),
    ("q 3-d", _set(q=lambda a: a["q"][0]), r"q has shape \[2, 4, 576\]: expected 4 dimensions"),
    ("q strided last dim", _set(q=lambda a: torch.zeros(2, 2, 4, 1152, dtype=torch.bfloat16)[..., ::2]),
     r"q: the last dimension must be contiguous"),
    ("kv[..., :512] view", _set(kv_cache=lambda a: a["kv_cache"][..., :512]),
     r"kv_cache has shape \[\d+, 16, 512\]: .*kv\[\.\.\., :512\]"),
    ("kv int8", _set(kv_cache=lambda a: a["kv_cache"].to(torch.int8)), r"kv_cache: dtype torch.int8"),
    ("two kv heads", _set(kv_cache=lambda a: a["kv_cache"].unsqueeze(2).expand(-1, -1, 2, -1)),
     r"one latent KV head"),
    ("page 300", _set(kv_cache=lambda a: torch.zeros(2, 300, 576, dtype=torch.bfloat16)),
     r"page_size = 300: not in the supported domain \(allowed 1..256\)"),
    ("out dtype", _set(out=lambda a: a["out"].half()), r"out: dtype torch.float16"),
    ("out shape", _set(out=lambda a: torch.empty(2, 2, 4, 576, dtype=torch.bfloat16)), r"out has shape \[2, 2, 4, 576\]"),
    ("lse dtype", _set(lse=lambda a: a["lse"].double()), r"lse: dtype torch.float64"),
    ("lse FlashMLA layout", _set(lse=lambda a: torch.empty(2, 4, 2)), r"lse has shape \[2, 4, 2\]"),
    ("no page ids", _set(block_table=None), r"page ids: give either block_table"),
    ("both page ids", _set(kv_indptr=lambda a: torch.zeros(3, dtype=torch.int32),
                           kv_indices=lambda a: torch.zeros(3, dtype=torch.int32)), r"page ids: give either"),
    ("indptr without indices", _set(block_table=None, kv_indptr=lambda a: torch.zeros(3, dtype=torch.int32)),
     r"page ids"),
    ("int64 block table", _set(block_table=lambda a: a["block_table"].long()), r"block_table: dtype torch.int64"),
    ("block table rows", _set(block_table=lambda a: a["block_table"][:1]), r"block_table has shape \[1, \d+\]: expected 2 rows"),
    ("short indptr", _set(block_table=None, kv_indptr=lambda a: torch.zeros(2, dtype=torch.int32),
                          kv_indices=lambda a: torch.zeros(3, dtype=torch.int32)), r"kv_indptr has shape \[2\]: expected 3 rows"),
    ("int64 kv_len", _set(kv_len=lambda a: a["kv_len"].long()), r"kv_len: dtype torch.int64"),
    ("kv_len rows", _set(kv_len=lambda a: a["kv_len"][:1]), r"kv_len has shape \[1\]: expected 2 rows"),
    ("zero scale", _set(softmax_scale=0.0), r"softmax_scale = 0.0: not in the supported domain \(finite and > 0\)"),
    ("nan kv_scale", _set(kv_scale=math.nan), r"kv_scale = nan: not in the supported domain"),
    ("infinite score factor", _set(softmax_scale=1e30, kv_scale=1e9),
     r"softmax_scale x kv_scale = 1e\+30 x 1000000000.0: not in the supported domain \(a product below"),
    ("split mode", _set(split_mode="half"), r"split_mode = 'half': not in the supported domain"),
    ("lse format", _set(lse_format="log10"), r"lse_format = 'log10': not in the supported domain"),
    ("plan step", _set(plan_step="reuse"), r"plan_step = 'reuse': not in the supported domain"),
    ("compute", _set(compute="fp4"), r"compute = 'fp4': not in the supported domain"),
    ("fp8 matrix mode with a bf16 cache", _set(compute="fp8_matrix"),
     r"compute = 'fp8_matrix': not in the supported domain \(a torch.float8_e4m3fn cache \(kv_cache is torch.bfloat16"),
    ("65 splits", _set(split_mode="fixed", num_splits=65), r"num_splits = 65: not in the supported domain \(allowed 1..64\)"),
    ("0 splits", _set(split_mode="fixed", num_splits=0), r"num_splits = 0: not in the supported domain"),
    ("meta kv_len", _set(kv_len=lambda a: a["kv_len"].to("meta")), r"kv_len is on meta, q on cpu"),
]


@pytest.mark.parametrize("name,change,message", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise(name, change, message):
    a = base_args()
    change(a)
    with pytest.raises(mlakit.ArgumentError, match=message) as e:
        torch.ops.mlakit.decode(**a)
    assert isinstance(e.value, ValueError) and e.value.code == "invalid_argument"


def test_good_base_args_run():
    torch.ops.mlakit.decode(**base_args())


ORDER = ["q", "kv_cache", "block_table", "kv_indptr", "kv_indices", "kv_len", "out", "lse", "softmax_scale"]


@pytest.mark.parametrize("form", ["required only", "all positional", "keywords", "no lse", "workspace",
                                  "workspace keyword"])
def test_op_bumps_the_versions_of_what_it_writes(form):
    # The dispatcher hands the ADInplaceOrView kernel the call without its trailing defaults
    # (workspace=None above all): torch.library.custom_op's kernel raised IndexError on that in
    # PyTorch 2.11, whatever the caller passed.
    a = base_args()
    ws = torch.empty(1024, dtype=torch.uint8)
    if form == "no lse":
        a["lse"] = None
    positional = [a[k] for k in ORDER]
    if form == "required only":
        torch.ops.mlakit.decode(*positional)
    elif form == "all positional":
        torch.ops.mlakit.decode(*positional, 1.0, True, "auto", 0, None)
    elif form in ("keywords", "no lse"):
        torch.ops.mlakit.decode(**a, kv_scale=1.0, causal=True)
    elif form == "workspace":
        torch.ops.mlakit.decode(*positional, 1.0, True, "auto", 0, ws)
    else:
        torch.ops.mlakit.decode(*positional, workspace=ws)
    assert a["out"]._version > 0
    if a["lse"] is not None:
        assert a["lse"]._version > 0
    assert ws._version == (1 if form.startswith("workspace") else 0)


def test_op_has_no_derivative_and_records_no_graph():
    a = base_args()
    a["q"] = a["q"].float().requires_grad_().to(torch.bfloat16)
    torch.ops.mlakit.decode(**a)
    assert not a["out"].requires_grad and a["out"].grad_fn is None
    assert not a["lse"].requires_grad


def test_functional_wrapper_rejects_non_tensor_q():
    with pytest.raises(mlakit.ArgumentError, match="q has shape"):
        mlakit.decode([1, 2], None, None, softmax_scale=1.0)


# ---- views -------------------------------------------------------------------------------------

def test_join_latent_cache_is_a_view():
    kv = torch.randn(5, 16, 576)
    joined = mlakit.join_latent_cache(kv[..., :512], kv[..., 512:])
    assert joined.data_ptr() == kv.data_ptr() and joined.stride() == kv.stride()
    assert torch.equal(joined, kv)
    wide = torch.randn(5, 16, 1, 640)[..., :576]  # rows padded to 640
    assert torch.equal(mlakit.join_latent_cache(wide[..., :512], wide[..., 512:]), wide)


def test_join_latent_cache_rejects_separate_buffers():
    with pytest.raises(mlakit.ArgumentError, match="not the two parts of one cache row"):
        mlakit.join_latent_cache(torch.randn(5, 16, 512), torch.randn(5, 16, 64))


def test_join_q():
    q = torch.randn(3, 4, 576)
    assert mlakit.join_q(q[..., :512], q[..., 512:]).data_ptr() == q.data_ptr()
    a, b = torch.randn(3, 4, 512), torch.randn(3, 4, 64)
    assert torch.equal(mlakit.join_q(a, b), torch.cat([a, b], -1))


def test_strided_views_accepted_on_cpu():
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16)
    qw = torch.zeros(2, 2, 4, 640, dtype=torch.bfloat16)
    qw[..., :576] = case["q"]
    kvw = torch.zeros(case["kv_cache"].shape[:2] + (640,), dtype=torch.bfloat16)
    kvw[..., :576] = case["kv_cache"]
    ow = torch.zeros(2, 2, 4, 600, dtype=torch.bfloat16)
    mlakit.decode(qw[..., :576], kvw[..., :576], case["kv_len"], block_table=case["block_table"],
                  softmax_scale=SCALE, out=ow[..., :512])
    ref, _ = reference(case, softmax_scale=SCALE)
    torch.testing.assert_close(ow[..., :512], ref.bfloat16())


# ---- workspace and extension -------------------------------------------------------------------

@pytest.mark.skipif(mlakit.has_cuda_extension(), reason="the extension is built here")
def test_workspace_without_extension_says_why():
    with pytest.raises(mlakit.Error, match="CUDA extension is not available"):
        mlakit._workspace._bytes(torch.device("cuda", 0), 1, 16, 0, 0)


def test_workspace_argument_checks():
    with pytest.raises(mlakit.ArgumentError, match="q_len = 0"):
        mlakit.workspace(4, 16, 0)
    with pytest.raises(mlakit.ArgumentError, match="split_mode"):
        mlakit.workspace(4, 16, 1, split="sometimes")


# ---- FlashMLA adapter --------------------------------------------------------------------------

def test_flashmla_adapter_layout():
    from mlakit import flashmla
    case = make_case(batch=3, q_len=2, heads=16, kv_lens=(0, 37, 130), page_size=64)
    q = case["q"]
    k_cache = case["kv_cache"].unsqueeze(2)  # FlashMLA: [blocks, page, 1, 576]
    meta, splits = flashmla.get_mla_metadata(case["kv_len"], q.shape[1] * q.shape[2], 1)
    out, lse = flashmla.flash_mla_with_kvcache(q, k_cache, case["block_table"], case["kv_len"], 512,
                                               meta, splits, causal=True)
    ref_out, ref_lse = reference(case, softmax_scale=SCALE)
    assert out.shape == (3, 2, 16, 512) and lse.shape == (3, 16, 2) and lse.is_contiguous()
    torch.testing.assert_close(out, ref_out.bfloat16())
    # FlashMLA's convention: LSE +inf (not -inf) for a row that sees no key
    assert torch.all(lse[0] == math.inf)
    torch.testing.assert_close(lse[1:], ref_lse[1:].transpose(1, 2))


def test_flashmla_adapter_new_style_metadata_and_errors():
    from mlakit import flashmla
    case = make_case(batch=1, q_len=1, heads=16, kv_lens=(10,), page_size=64)
    meta, none = flashmla.get_mla_metadata()
    assert none is None
    k_cache = case["kv_cache"].unsqueeze(2)
    args = (case["q"], k_cache, case["block_table"], case["kv_len"])
    flashmla.flash_mla_with_kvcache(*args, 512, meta, None, softmax_scale=0.1)
    with pytest.raises(mlakit.ArgumentError, match="head_dim_v = 576"):
        flashmla.flash_mla_with_kvcache(*args, 576, meta, None)
    with pytest.raises(mlakit.ArgumentError, match="is_fp8_kvcache"):
        flashmla.flash_mla_with_kvcache(*args, 512, meta, None, is_fp8_kvcache=True)
    with pytest.raises(mlakit.ArgumentError, match="indices"):
        flashmla.flash_mla_with_kvcache(*args, 512, meta, None, indices=torch.zeros(1, 1, 8, dtype=torch.int32))


# ---- FlashInfer adapter ------------------------------------------------------------------------

@pytest.mark.parametrize("q_len", [1, 3])
def test_flashinfer_adapter_layout(q_len):
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case = make_case(batch=3, q_len=q_len, heads=4, page_size=1, kv_lens=(7, 30, 0), seed=19)
    kv = case["kv_cache"]
    q = case["q"].reshape(3 * q_len, 4, 576)
    w = BatchMLAPagedAttentionWrapper(torch.empty(1, dtype=torch.uint8))
    qo_indptr = torch.arange(4, dtype=torch.int32) * q_len
    w.plan(qo_indptr, case["kv_indptr"], case["kv_indices"], case["kv_len"], 4, 512, 64, 1, q_len > 1,
           SCALE, torch.bfloat16, torch.bfloat16)
    out, lse2 = w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], return_lse=True)
    ref_out, ref_lse = reference(case, "csr", softmax_scale=SCALE, causal=q_len > 1)
    torch.testing.assert_close(out, ref_out.bfloat16().reshape(3 * q_len, 4, 512))
    torch.testing.assert_close(lse2 * math.log(2.0), ref_lse.reshape(3 * q_len, 4))
    # Two separate cache tensors (FlashInfer's layout) are read in place: the same result.
    out2, lse3 = w.run(q[..., :512], q[..., 512:], kv[..., :512].clone(), kv[..., 512:].clone(),
                       return_lse=True)
    assert torch.equal(out2, out) and torch.equal(lse3, lse2)


def test_flashinfer_adapter_rejects_ragged_q():
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case = make_case(batch=3, q_len=1, heads=4, page_size=1, kv_lens=(7, 30, 0))
    w = BatchMLAPagedAttentionWrapper(None)
    with pytest.raises(mlakit.ArgumentError, match="same number of query tokens"):
        w.plan(torch.tensor([0, 1, 3, 4], dtype=torch.int32), case["kv_indptr"], case["kv_indices"],
               case["kv_len"], 4, 512, 64, 1, True, SCALE, torch.bfloat16, torch.bfloat16)


def test_adapters_forward_compute(monkeypatch):
    """compute="fp8_matrix" reaches mlakit.decode from both adapters (FlashMLA's call keyword,
    FlashInfer's plan() keyword), and a cache the mode does not serve is refused with the
    argument named."""
    from mlakit import flashmla
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    seen = []
    real = mlakit.decode

    def spy(*args, **kwargs):
        seen.append(kwargs.get("compute"))
        return real(*args, **kwargs)

    monkeypatch.setattr(mlakit, "decode", spy)
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(5, 70), page_size=16, kv_dtype=torch.float8_e4m3fn)
    ref_out, _ = reference(case, softmax_scale=SCALE, causal=True)
    out, _ = flashmla.flash_mla_with_kvcache(case["q"], case["kv_cache"].unsqueeze(2), case["block_table"],
                                             case["kv_len"], 512, None, None, softmax_scale=SCALE,
                                             causal=True, kv_scale=1.0, compute="fp8_matrix")
    torch.testing.assert_close(out, ref_out.bfloat16())
    w = BatchMLAPagedAttentionWrapper(None)
    qo_indptr = torch.arange(3, dtype=torch.int32) * 2
    w.plan(qo_indptr, case["kv_indptr"], case["kv_indices"], case["kv_len"], 4, 512, 64, 16, True, SCALE,
           torch.bfloat16, torch.float8_e4m3fn, compute="fp8_matrix")
    q, kv = case["q"].reshape(4, 4, 576), case["kv_cache"]
    out2 = w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], ckv_scale=1.0, kpe_scale=1.0)
    torch.testing.assert_close(out2, ref_out.bfloat16().reshape(4, 4, 512))
    assert seen == ["fp8_matrix", "fp8_matrix"]

    bf16 = make_case(batch=1, q_len=1, heads=4, kv_lens=(10,), page_size=16)
    with pytest.raises(mlakit.ArgumentError, match="compute = 'fp8_matrix'"):
        flashmla.flash_mla_with_kvcache(bf16["q"], bf16["kv_cache"].unsqueeze(2), bf16["block_table"],
                                        bf16["kv_len"], 512, None, None, compute="fp8_matrix")
    with pytest.raises(mlakit.ArgumentError, match=r"compute = 'fp8_matrix'.*kv_data_type is torch.bfloat16"):
        w.plan(qo_indptr[:2], bf16["kv_indptr"], bf16["kv_indices"], bf16["kv_len"], 4, 512, 64, 16, True,
               SCALE, torch.bfloat16, torch.bfloat16, compute="fp8_matrix")
    with pytest.raises(mlakit.ArgumentError, match="compute = 'fp4'"):
        w.plan(qo_indptr[:2], bf16["kv_indptr"], bf16["kv_indices"], bf16["kv_len"], 4, 512, 64, 16, True,
               SCALE, torch.bfloat16, torch.bfloat16, compute="fp4")


# ---- the compiled binding, where it was built (CI builds it; no GPU needed) --------------------

needs_ext = pytest.mark.skipif(not mlakit.has_cuda_extension(), reason="the extension is not built")


@needs_ext
def test_binding_reports_cpu_tensors_as_a_status():
    case = make_case(batch=2, q_len=2, heads=4, kv_lens=(3, 90), page_size=16)
    q = case["q"]
    out = torch.empty(q.shape[:3] + (512,), dtype=q.dtype)
    code, name, message = mlakit._ext._C.decode(q, case["kv_cache"], case["block_table"], None, None,
                                                case["kv_len"], out, None, None, SCALE, 1.0, True, 0, 0, 0)
    assert (code, name, message) == (1, "invalid_argument", "q: must be a CUDA tensor")


@needs_ext
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present")
def test_binding_without_a_gpu_reports_a_runtime_error():
    size, code, name, message = mlakit._ext._C.workspace_bytes(4, 32, 0, 0, 0)
    assert (code, name) == (4, "runtime_error") and message
    with pytest.raises(mlakit.Error) as e:
        mlakit.workspace(4, 16, 2, device="cuda:0")
    assert e.value.code == "runtime_error"


def test_flashinfer_adapter_cuda_graph_buffers_keep_their_addresses():
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    case = make_case(batch=3, q_len=1, heads=4, page_size=1, kv_lens=(7, 30, 2), seed=21)
    bufs = dict(kv_indptr=torch.zeros(8, dtype=torch.int32), kv_indices=torch.zeros(100, dtype=torch.int32),
                kv_len_arr=torch.zeros(8, dtype=torch.int32))
    w = BatchMLAPagedAttentionWrapper(None, use_cuda_graph=True, **bufs)
    kv, q = case["kv_cache"], case["q"].reshape(3, 4, 576)
    for lens in [(7, 30, 2), (1, 5, 0)]:
        case["kv_len"] = torch.tensor(lens, dtype=torch.int32)
        w.plan(torch.arange(4, dtype=torch.int32), case["kv_indptr"], case["kv_indices"], case["kv_len"],
               4, 512, 64, 1, False, SCALE, torch.bfloat16, torch.bfloat16)
        assert w._plan["kv_len"].data_ptr() == bufs["kv_len_arr"].data_ptr()
        assert w._plan["kv_indices"].data_ptr() == bufs["kv_indices"].data_ptr()
        out = w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:])
        ref, _ = reference(case, "csr", softmax_scale=SCALE, causal=False)
        torch.testing.assert_close(out, ref.bfloat16().reshape(3, 4, 512))
    with pytest.raises(mlakit.ArgumentError, match="needs the kv_indptr, kv_indices and kv_len_arr buffers"):
        BatchMLAPagedAttentionWrapper(None, use_cuda_graph=True)
