"""GPU tests of one split plan per model step: plan_step through the op (the layers of a step
decode with the plan of the first; decode_only refused where the workspace holds no plan of the
call) and the adapters (one plan per FlashMLA metadata object and per FlashInfer plan(), inside
one CUDA graph: the graph holds one planner launch fewer per later layer, and every layer's
replayed output matches the reference). Skipped without a CUDA GPU."""
import math

import pytest
import torch

import mlakit
from cases import make_case
from graph_nodes import capture
from test_gpu import SCALE, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

LAYERS = 3


@pytest.fixture(scope="module", autouse=True)
def extension():
    assert mlakit.has_cuda_extension(), f"a GPU is present but mlakit._C did not load: {mlakit._ext.LOAD_ERROR}"


def layers_of(kv_dtype, q_len, lens, seed):
    """LAYERS problems of one step: the same lengths (one kv_len tensor, as an engine passes it)
    and block-table width, each layer its own Q, cache and page order."""
    cases = [make_case(batch=len(lens), q_len=q_len, heads=16, kv_dtype=kv_dtype, page_size=64, kv_lens=lens,
                       device="cuda", seed=seed + layer) for layer in range(LAYERS)]
    width = max(c["block_table"].shape[1] for c in cases)
    for c in cases:
        c["block_table"] = torch.nn.functional.pad(c["block_table"], (0, width - c["block_table"].shape[1]))
        c["kv_len"] = cases[0]["kv_len"]
    return cases


def kernels(fn):
    """The number of kernel nodes of fn() captured in a CUDA graph."""
    _, _, kinds, _ = capture(fn)
    return kinds["kernel"]


def replay_step(step, kernels_expected):
    """Captures step() (every layer's call of one model step, returning (out, lse) per layer)
    in a CUDA graph, checks its kernel count, replays it with NaN-poisoned outputs and returns
    the outputs."""
    g, results, kinds, _ = capture(step)
    assert kinds["kernel"] == kernels_expected
    for o, l in results:
        o.fill_(math.nan)
        l.fill_(math.nan)
    g.replay()
    return results


SHAPES = [(1, (8192,)), (8, (6000, 0, 65, 3000)), (1, (5000, 300, 0)), (4, (4096,) * 20)]


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("q_len,lens", SHAPES)
def test_op_layers_share_one_plan(q_len, lens, kv_dtype):
    cases = layers_of(kv_dtype, q_len, lens, seed=10 * q_len + len(lens))
    kv_scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    ws = mlakit.workspace(batch=len(lens), num_heads=16, q_len=q_len)
    for layer, case in enumerate(cases):
        step = "plan_and_decode" if layer == 0 else "decode_only"
        out, lse = mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                                 softmax_scale=SCALE, kv_scale=kv_scale, return_lse=True, workspace=ws,
                                 plan_step=step)
        check(case, out, lse, kv_scale=kv_scale)
    # plan_only writes no output; decode_only after it decodes.
    case = cases[1]
    out = torch.full((len(lens), q_len, 16, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((len(lens), q_len, 16), math.nan, device="cuda")
    args = (case["q"], case["kv_cache"], case["block_table"], None, None, case["kv_len"], out, lse, SCALE,
            kv_scale, True, "auto", 0, ws)
    torch.ops.mlakit.decode(*args, plan_step="plan_only")
    torch.cuda.synchronize()
    assert torch.all(torch.isnan(out)) and torch.all(torch.isnan(lse))
    torch.ops.mlakit.decode(*args, plan_step="decode_only")
    check(case, out, lse, kv_scale=kv_scale)


def test_layers_share_one_plan_in_inference_mode():
    """Serving engines make their tensors under torch.inference_mode, where tensors keep no
    version counter: the plan record takes them by address and layout."""
    with torch.inference_mode():
        cases = layers_of(torch.float8_e4m3fn, 8, (3000, 100), seed=9)
        ws = mlakit.workspace(batch=2, num_heads=16, q_len=8)
        for layer, case in enumerate(cases):
            out, lse = mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                                     softmax_scale=SCALE, kv_scale=0.5, return_lse=True, workspace=ws,
                                     plan_step="plan_and_decode" if layer == 0 else "decode_only")
            check(case, out, lse, kv_scale=0.5)


def test_op_decode_only_refused_without_the_plan():
    cases = layers_of(torch.bfloat16, 8, (3000, 100), seed=5)
    case = cases[0]
    ws = torch.empty(mlakit.workspace(batch=2, num_heads=16, q_len=8).numel(), dtype=torch.uint8, device="cuda")

    def call(step, **kw):
        return mlakit.decode(case["q"], case["kv_cache"], kw.get("kv_len", case["kv_len"]),
                             block_table=case["block_table"], softmax_scale=SCALE, workspace=ws, plan_step=step,
                             split=kw.get("split", "auto"))
    with pytest.raises(mlakit.ArgumentError, match="plan_step = 'decode_only'"):
        call("decode_only")  # nothing planned into this workspace
    call("plan_and_decode")
    call("decode_only")
    with pytest.raises(mlakit.ArgumentError, match="plan_step = 'decode_only'"):
        call("decode_only", split="none")  # another split mode
    with pytest.raises(mlakit.ArgumentError, match="plan_step = 'decode_only'"):
        call("decode_only", kv_len=case["kv_len"].clone())  # another kv_len tensor
    case["kv_len"].add_(0)  # rewritten in place: a new version
    with pytest.raises(mlakit.ArgumentError, match="plan_step = 'decode_only'"):
        call("decode_only")
    # A plan enqueued eagerly does not serve a capture (the graph may replay after the
    # workspace has held other plans).
    call("plan_and_decode")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(mlakit.ArgumentError, match="plan_step = 'decode_only'"):
        with torch.cuda.graph(g):
            call("decode_only")


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
@pytest.mark.parametrize("q_len,lens", SHAPES)
def test_flashmla_adapter_one_plan_per_metadata(q_len, lens, kv_dtype):
    from mlakit import flashmla
    cases = layers_of(kv_dtype, q_len, lens, seed=20 * q_len + len(lens))
    batch = len(lens)
    kv_scale = 0.5 if kv_dtype == torch.float8_e4m3fn else 1.0
    c0 = cases[0]
    out = torch.empty(batch, q_len, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(batch, q_len, 16, device="cuda")
    op_args = (c0["q"], c0["kv_cache"], c0["block_table"], None, None, c0["kv_len"], out, lse, SCALE, kv_scale)
    full = kernels(lambda: torch.ops.mlakit.decode(*op_args))
    plan = kernels(lambda: torch.ops.mlakit.decode(*op_args, plan_step="plan_only"))
    assert plan in (0, 1)
    if q_len >= 4:
        assert plan == 1  # the 64-row kernels read the planner's plan

    def step():
        meta, splits = flashmla.get_mla_metadata(c0["kv_len"], q_len * 16, 1)
        return [flashmla.flash_mla_with_kvcache(c["q"], c["kv_cache"].unsqueeze(2), c["block_table"], c["kv_len"],
                                                512, meta, splits, softmax_scale=SCALE, causal=True,
                                                kv_scale=kv_scale) for c in cases]
    results = replay_step(step, LAYERS * full - (LAYERS - 1) * plan)
    for case, (o, l) in zip(cases, results):
        lse_bsh = l.transpose(1, 2).clone()
        lse_bsh[torch.isinf(lse_bsh)] = -math.inf
        check(case, o, lse_bsh, kv_scale=kv_scale)
    # Eagerly, the same: every layer matches the reference.
    for case, (o, l) in zip(cases, step()):
        lse_bsh = l.transpose(1, 2).clone()
        lse_bsh[torch.isinf(lse_bsh)] = -math.inf
        check(case, o, lse_bsh, kv_scale=kv_scale)


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_flashinfer_adapter_one_plan_per_plan_call(kv_dtype):
    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper
    q_len, lens = 8, (6000, 0, 65, 3000)
    batch = len(lens)
    cases = [make_case(batch=batch, q_len=q_len, heads=16, kv_dtype=kv_dtype, page_size=1, kv_lens=lens,
                       device="cuda", seed=70 + layer) for layer in range(LAYERS)]
    fp8 = kv_dtype == torch.float8_e4m3fn
    scales = dict(ckv_scale=0.5, kpe_scale=0.5) if fp8 else {}
    w = BatchMLAPagedAttentionWrapper(None)
    c0 = cases[0]
    w.plan(torch.arange(batch + 1, dtype=torch.int32) * q_len, c0["kv_indptr"], c0["kv_indices"], c0["kv_len"],
           16, 512, 64, 1, True, SCALE, torch.bfloat16, kv_dtype)
    p = w._plan
    out = torch.empty(batch, q_len, 16, 512, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(batch, q_len, 16, device="cuda")
    q0 = c0["q"]
    op_args = (q0, c0["kv_cache"], None, p["kv_indptr"], p["kv_indices"], p["kv_len"], out, lse, SCALE,
               0.5 if fp8 else 1.0)
    full = kernels(lambda: torch.ops.mlakit.decode(*op_args))
    plan = kernels(lambda: torch.ops.mlakit.decode(*op_args, plan_step="plan_only"))
    assert plan == 1

    def step():
        # Every layer's cache holds its pages at the plan's page ids (c0's); the same
        # lengths, so one plan.
        res = []
        for c in cases:
            kv = c["kv_cache"]
            q = c["q"].reshape(batch * q_len, 16, 576)
            res.append(w.run(q[..., :512], q[..., 512:], kv[..., :512], kv[..., 512:], return_lse=True,
                             return_lse_base_on_e=True, **scales))
        return res
    results = replay_step(step, LAYERS * full - (LAYERS - 1) * plan)
    for case, (o, l) in zip(cases, results):
        c = dict(case, kv_indptr=c0["kv_indptr"], kv_indices=c0["kv_indices"])
        check(c, o.view(batch, q_len, 16, 512), l.view(batch, q_len, 16), "csr", kv_scale=0.5 if fp8 else 1.0)
