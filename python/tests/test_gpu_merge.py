"""GPU tests of torch.ops.mlakit.merge_states: context-parallel decode (decode() on shards of
each request's pages, merged) against the reference decode over the whole cache, 2..8 parts,
causal and not; empty parts (their O NaN, never read) and rows of empty parts; every pair of
part and output dtypes; a CUDA graph of one kernel replayed with new values; bitwise
repeatability; torch.compile. Outputs are NaN-poisoned before each run. Skipped without a GPU."""
import math

import pytest
import torch

import mlakit
from cases import make_case, rel_l2
from graph_nodes import capture
from test_gpu import SCALE, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

DTYPES = [torch.bfloat16, torch.float16, torch.float32]
O_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-4}


@pytest.fixture(scope="module", autouse=True)
def extension():
    assert mlakit.has_cuda_extension(), f"a GPU is present but mlakit._C did not load: {mlakit._ext.LOAD_ERROR}"
    torch.backends.cuda.matmul.allow_tf32 = False


def shard_decode(case, shards, causal, q_dtype=torch.bfloat16):
    """Each request's pages cut into `shards` contiguous pieces, as context-parallel ranks hold
    them; decode() of piece s writes part s of one [shards, batch * q_len, heads, 512] tensor.
    Every piece but the last sees all of its keys; the last one is causal when `causal`."""
    q, table, lens = case["q"], case["block_table"], case["kv_len"].tolist()
    batch, q_len, heads, _ = q.shape
    page = case["kv_cache"].shape[1]
    part_o = torch.full((shards, batch * q_len, heads, 512), math.nan, dtype=q_dtype, device="cuda")
    part_lse = torch.full((shards, batch * q_len, heads), math.nan, device="cuda")
    for s in range(shards):
        sub = torch.zeros(batch, table.shape[1], dtype=torch.int32, device="cuda")
        sub_lens = []
        for b in range(batch):
            pages = math.ceil(lens[b] / page)
            first, last = pages * s // shards, pages * (s + 1) // shards
            sub[b, :last - first] = table[b, first:last]
            sub_lens.append(max(0, min(lens[b], last * page) - first * page))
        mlakit.decode(q, case["kv_cache"], torch.tensor(sub_lens, dtype=torch.int32, device="cuda"),
                      block_table=sub, softmax_scale=SCALE, causal=causal and s == shards - 1,
                      out=part_o[s].view(batch, q_len, heads, 512), lse=part_lse[s].view(batch, q_len, heads))
    return part_o, part_lse


@pytest.mark.parametrize("shards", [2, 3, 5, 8])
@pytest.mark.parametrize("q_len,causal", [(1, False), (4, False), (8, True)])
def test_context_parallel_decode_is_the_decode_of_the_whole_cache(shards, q_len, causal):
    # Lengths leave the last shard at least q_len keys, so that a causal window lies in it.
    case = make_case(batch=3, q_len=q_len, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=16,
                     kv_lens=(700, 2049, 130), extra_pages=0, device="cuda", seed=shards * 10 + q_len)
    part_o, part_lse = shard_decode(case, shards, causal)
    out = torch.full((3 * q_len, 16, 512), math.nan, dtype=torch.bfloat16, device="cuda")
    lse = torch.full((3 * q_len, 16), math.nan, device="cuda")
    mlakit.merge_states(part_o, part_lse, out=out, out_lse=lse)
    check(case, out.view(3, q_len, 16, 512), lse.view(3, q_len, 16), causal=causal)


@pytest.mark.parametrize("part_dtype", DTYPES)
@pytest.mark.parametrize("out_dtype", DTYPES)
def test_dtypes_empty_parts_and_empty_rows(part_dtype, out_dtype):
    g = torch.Generator(device="cuda").manual_seed(7)
    n, tokens, heads, dim = 6, 33, 16, 512
    po = torch.randn(n, tokens, heads, dim, device="cuda", generator=g).to(part_dtype)
    pl = torch.randn(n, tokens, heads, device="cuda", generator=g) * 4
    empty = torch.rand(n, tokens, heads, device="cuda", generator=g) < 0.3
    pl[empty] = -math.inf
    pl[0, 0, :] = math.inf                # FlashMLA's mark of an empty row
    pl[:, 1, 3] = -math.inf               # a row of empty parts
    po[empty] = math.nan                  # never read
    po[0, 0] = math.nan
    po[:, 1, 3] = math.nan
    out = torch.full((tokens, heads, dim), math.nan, dtype=out_dtype, device="cuda")
    lse = torch.full((heads, tokens), math.nan, device="cuda").t()  # vLLM's [heads, tokens]
    mlakit.merge_states(po, pl, out=out, out_lse=lse)
    ref_o, ref_l = mlakit.merge_states_reference(po.cpu(), pl.cpu())
    torch.cuda.synchronize()
    assert torch.all(out[1, 3] == 0) and lse[1, 3] == -math.inf
    seen = torch.isfinite(ref_l)
    assert torch.equal(torch.isfinite(lse.cpu()), seen)
    assert rel_l2(out.cpu()[seen].float(), ref_o[seen]) < O_TOL[out_dtype]
    assert (lse.cpu()[seen] - ref_l[seen]).abs().max() < 1e-5


def test_graph_of_one_kernel_replays_new_values_bitwise_as_direct_calls():
    n, tokens, heads, dim = 4, 64, 16, 512
    po = torch.randn(n, tokens, heads, dim, device="cuda").bfloat16()
    pl = torch.randn(n, tokens, heads, device="cuda")
    out = torch.empty(tokens, heads, dim, dtype=torch.bfloat16, device="cuda")
    lse = torch.empty(tokens, heads, device="cuda")
    g, _, kinds, names = capture(lambda: torch.ops.mlakit.merge_states(po, pl, out, lse))
    assert kinds == {"kernel": 1}, dict(kinds)
    assert names is None or "merge_states_kernel" in names[0]
    for step in range(3):
        po.copy_(torch.randn_like(po, dtype=torch.float32))
        pl.copy_(torch.randn_like(pl) * 3)
        pl[step] = -math.inf
        out.fill_(math.nan)
        lse.fill_(math.nan)
        g.replay()
        replayed = out.clone(), lse.clone()
        direct = mlakit.merge_states(po, pl, return_lse=True)
        torch.cuda.synchronize()
        assert torch.equal(replayed[0], direct[0]) and torch.equal(replayed[1], direct[1])
        ref_o, ref_l = mlakit.merge_states_reference(po.cpu(), pl.cpu())
        assert rel_l2(replayed[0].cpu().float(), ref_o) < 1e-2


def test_torch_compile_fullgraph_inductor():
    def f(po, pl):
        out, lse = mlakit.merge_states(po, pl, return_lse=True, out_dtype=torch.float32)
        return out * 2, lse

    po = torch.randn(3, 8, 16, 512, device="cuda").half()
    pl = torch.randn(3, 8, 16, device="cuda")
    out, lse = torch.compile(f, fullgraph=True)(po, pl)
    ref_o, ref_l = mlakit.merge_states_reference(po.cpu(), pl.cpu())
    assert rel_l2(out.cpu() / 2, ref_o) < 1e-4 and (lse.cpu() - ref_l).abs().max() < 1e-5


def test_library_rejections_come_back_as_argument_errors():
    po = torch.zeros(2, 3, 4, 512, dtype=torch.bfloat16, device="cuda")
    pl = torch.zeros(2, 3, 4, device="cuda")
    out = torch.zeros(3, 4, 512 + 8, dtype=torch.bfloat16, device="cuda")[..., 4:516]  # 8-byte aligned rows
    with pytest.raises(mlakit.ArgumentError, match=r"out = 0x[0-9a-f]+: not in the supported domain \(a 16-byte"):
        mlakit.merge_states(po, pl, out=out)
    lse = torch.zeros(3, device="cuda").unsqueeze(1).expand(3, 4)  # heads share one float
    with pytest.raises(mlakit.ArgumentError, match=r"out_lse_stride_head = 0: not in the supported domain"):
        mlakit.merge_states(po, pl, out_lse=lse)
