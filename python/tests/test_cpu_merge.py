"""CPU-side tests of torch.ops.mlakit.merge_states: schema, fake implementation, torch.compile
tracing, opcheck, argument errors, and the float64 reference against a row-by-row loop. They
need neither a GPU nor the compiled extension (the op's CPU implementation is the reference)."""
import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import mlakit
import mlakit._op


def parts(n=3, tokens=4, heads=2, dim=16, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, tokens, heads, dim, generator=g).to(dtype),
            torch.randn(n, tokens, heads, generator=g) * 3)


def naive(part_o, part_lse):
    n, tokens, heads, dim = part_o.shape
    out = torch.zeros(tokens, heads, dim, dtype=torch.float64)
    lse = torch.full((tokens, heads), -math.inf, dtype=torch.float64)
    for t in range(tokens):
        for h in range(heads):
            ls = [float(part_lse[p, t, h]) for p in range(n)]
            live = [p for p in range(n) if math.isfinite(ls[p])]
            if not live:
                continue
            m = max(ls[p] for p in live)
            w = {p: math.exp(ls[p] - m) for p in live}
            s = sum(w.values())
            out[t, h] = sum(w[p] * part_o[p, t, h].double() for p in live) / s
            lse[t, h] = m + math.log(s)
    return out, lse


def test_schema():
    schema = torch.ops.mlakit.merge_states.default._schema
    assert [a.name for a in schema.arguments] == ["part_o", "part_lse", "out", "out_lse"]
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    assert written == ["out", "out_lse"] and len(schema.returns) == 0


@pytest.mark.parametrize("n", [1, 2, 5, 8])
def test_reference_matches_a_row_by_row_loop(n):
    po, pl = parts(n=n, seed=n)
    pl[0, 1, 1] = -math.inf               # an empty part, its O never read:
    po[0, 1, 1] = math.nan
    pl[:, 2, 0] = -math.inf               # a row of empty parts
    pl[n - 1, 3, 1] = math.inf            # FlashMLA's +inf: empty too
    po[n - 1, 3, 1] = math.nan
    out, lse = mlakit.merge_states(po, pl, return_lse=True)
    ref_o, ref_l = naive(po.nan_to_num(0.0), torch.where(pl == math.inf, -math.inf, pl))
    torch.testing.assert_close(out.double(), ref_o, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(lse.double(), ref_l, rtol=1e-6, atol=1e-6)
    assert torch.all(out[2, 0] == 0) and lse[2, 0] == -math.inf


def test_merge_of_two_halves_is_the_reference_decode_of_the_whole():
    from cases import make_case
    case = make_case(batch=1, q_len=2, heads=4, page_size=4, kv_lens=(37,), extra_pages=0, seed=3)
    whole_o, whole_l = mlakit.decode_reference(case["q"], case["kv_cache"], case["kv_len"],
                                               block_table=case["block_table"], softmax_scale=0.1, causal=False)
    table = case["block_table"]
    halves = [(table[:, :5], 20), (table[:, 5:], 17)]  # pages 0..4 (20 tokens), 5..9 (17)
    o_parts, l_parts = [], []
    for t, n in halves:
        o, l = mlakit.decode_reference(case["q"], case["kv_cache"], torch.tensor([n], dtype=torch.int32),
                                       block_table=t.contiguous(), softmax_scale=0.1, causal=False)
        o_parts.append(o[0])
        l_parts.append(l[0])
    out, lse = mlakit.merge_states(torch.stack(o_parts), torch.stack(l_parts), return_lse=True)
    torch.testing.assert_close(out, whole_o[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(lse, whole_l[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("part_dtype,out_dtype", [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32),
                                                  (torch.float16, torch.float16)])
def test_mixed_dtypes_and_strided_outputs(part_dtype, out_dtype):
    po, pl = parts(dtype=part_dtype)
    out = torch.full((4, 2, 24), math.nan, dtype=out_dtype)[..., :16]
    lse_ht = torch.full((2, 4), math.nan)  # vLLM's [heads, tokens]
    mlakit.merge_states(po, pl, out=out, out_lse=lse_ht.t())
    ref_o, ref_l = naive(po.float(), pl)
    torch.testing.assert_close(out.double(), ref_o.to(out_dtype).double())
    torch.testing.assert_close(lse_ht.t().double(), ref_l, rtol=1e-6, atol=1e-6)


def test_fake_impl_and_meta():
    with FakeTensorMode():
        po, pl = torch.empty(3, 5, 16, 512, dtype=torch.bfloat16), torch.empty(3, 5, 16)
        out, lse = mlakit.merge_states(po, pl, return_lse=True, out_dtype=torch.float32)
        assert out.shape == (5, 16, 512) and out.dtype == torch.float32 and lse.shape == (5, 16)
    out = mlakit.merge_states(torch.empty(2, 3, 4, 8, device="meta"), torch.empty(2, 3, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (3, 4, 8)


def test_compile_fullgraph_traces_the_op():
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(po, pl):
        out, lse = mlakit.merge_states(po, pl, return_lse=True)
        return out * 2, lse

    po, pl = parts()
    got = torch.compile(f, backend=backend, fullgraph=True)(po, pl)
    assert len(graphs) == 1 and "mlakit.merge_states" in graphs[0].code
    ref = f(po, pl)
    torch.testing.assert_close(got, ref)
    got = torch.compile(f, backend="aot_eager", fullgraph=True)(po, pl)
    torch.testing.assert_close(got, ref)


def test_opcheck():
    po, pl = parts()
    out = torch.empty(4, 2, 16)
    lse = torch.empty(4, 2)
    torch.library.opcheck(torch.ops.mlakit.merge_states.default, (po, pl, out, lse))


BAD = [
    ("0 parts", dict(part_o=torch.zeros(0, 4, 2, 16), part_lse=torch.zeros(0, 4, 2)),
     r"num_parts = 0: not in the supported domain \(allowed 1..4096\)"),
    ("head_dim 12", dict(part_o=torch.zeros(3, 4, 2, 12), out=torch.zeros(4, 2, 12)),
     r"head_dim = 12: not in the supported domain \(8..16384, a multiple of 8\)"),
    ("fp64 parts", dict(part_o=torch.zeros(3, 4, 2, 16, dtype=torch.float64)), r"part_o: dtype torch.float64"),
    ("lse fp16", dict(part_lse=torch.zeros(3, 4, 2, dtype=torch.float16)), r"part_lse: dtype torch.float16"),
    ("lse shape", dict(part_lse=torch.zeros(3, 2, 4)), r"part_lse has shape \[3, 2, 4\]: expected \[3, 4, 2\]"),
    ("out shape", dict(out=torch.zeros(4, 2, 8)), r"out has shape \[4, 2, 8\]: expected \[4, 2, 16\]"),
    ("out strided last", dict(out=torch.zeros(4, 2, 32)[..., ::2]), r"out: the last dimension must be contiguous"),
    ("out_lse shape", dict(out_lse=torch.zeros(2, 4)), r"out_lse has shape \[2, 4\]: expected \[4, 2\]"),
    ("3-d parts", dict(part_o=torch.zeros(4, 2, 16)), r"part_o has shape \[4, 2, 16\]: expected 4 dimensions"),
]


@pytest.mark.parametrize("name,change,message", BAD, ids=[b[0] for b in BAD])
def test_bad_arguments_raise(name, change, message):
    a = dict(part_o=torch.zeros(3, 4, 2, 16), part_lse=torch.zeros(3, 4, 2), out=torch.zeros(4, 2, 16),
             out_lse=torch.zeros(4, 2))
    a.update(change)
    with pytest.raises(mlakit.ArgumentError, match=message) as e:
        torch.ops.mlakit.merge_states(**a)
    assert e.value.code == "invalid_argument"


needs_ext = pytest.mark.skipif(not mlakit.has_cuda_extension(), reason="the extension is not built")


@needs_ext
def test_binding_reports_cpu_tensors_as_a_status():
    code, name, message = mlakit._ext._C.merge_states(torch.zeros(2, 3, 4, 8), torch.zeros(2, 3, 4),
                                                      torch.zeros(3, 4, 8), None)
    assert (code, name, message) == (1, "invalid_argument", "part_o: must be a CUDA tensor")
