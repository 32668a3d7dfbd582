"""CUDA graphs and torch.compile on the GPU. Skipped without a CUDA GPU."""
import pytest
import torch

import mlakit
import mlakit._workspace
from cases import make_case
from test_gpu import SCALE, check

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module", autouse=True)
def extension():
    assert mlakit.has_cuda_extension(), f"a GPU is present but mlakit._C did not load: {mlakit._ext.LOAD_ERROR}"
    torch.backends.cuda.matmul.allow_tf32 = False


STEPS = [(1, 2, 3, 4), (10, 64, 65, 100), (0, 500, 999, 1000), (1000, 1000, 1000, 1000)]


@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_graph_capture_replay_with_growing_lengths(kv_dtype):
    batch, q_len, heads = 4, 2, 16
    case = make_case(batch=batch, q_len=q_len, heads=heads, kv_dtype=kv_dtype, page_size=64,
                     kv_lens=(1000,) * batch, extra_pages=0, device="cuda", seed=23)
    q, kv, table, kv_len = case["q"], case["kv_cache"], case["block_table"], case["kv_len"]
    out = torch.empty(batch, q_len, heads, 512, dtype=q.dtype, device="cuda")
    lse = torch.empty(batch, q_len, heads, device="cuda")

    # An engine sizes the workspace for its largest batch, warms up outside the capture, then
    # captures smaller batches: nothing may be allocated while capturing.
    ws = mlakit.workspace(batch=64, num_heads=heads, q_len=q_len)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        mlakit.decode(q, kv, kv_len, block_table=table, softmax_scale=SCALE, out=out, lse=lse, kv_scale=0.5)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()

    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        mlakit.decode(q, kv, kv_len, block_table=table, softmax_scale=SCALE, out=out, lse=lse, kv_scale=0.5)
    assert mlakit.workspace(batch=64, num_heads=heads, q_len=q_len) is ws, "the capture allocated a workspace"

    for lens in STEPS:
        kv_len.copy_(torch.tensor(lens, dtype=torch.int32))
        out.zero_()
        g.replay()
        check(case, out, lse, kv_scale=0.5)


def test_capture_without_workspace_raises():
    case = make_case(batch=2, q_len=3, heads=12, page_size=64, kv_lens=(5, 50), device="cuda", seed=29)
    out = torch.empty(2, 3, 12, 512, dtype=torch.bfloat16, device="cuda")
    g = torch.cuda.CUDAGraph()
    with pytest.raises(mlakit.Error, match="none was allocated before the capture") as e:
        with torch.cuda.graph(g):
            mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                          softmax_scale=SCALE, out=out, split="none")
    assert e.value.code == "workspace_too_small"
    # the process goes on: the same call outside a capture runs
    out2 = mlakit.decode(case["q"], case["kv_cache"], case["kv_len"], block_table=case["block_table"],
                         softmax_scale=SCALE, split="none", return_lse=True)
    check(case, *out2)


class Attention(torch.nn.Module):
    def forward(self, q, kv_cache, kv_len, block_table):
        out, lse = mlakit.decode(q, kv_cache, kv_len, block_table=block_table, softmax_scale=SCALE,
                                 return_lse=True)
        return out * 2, lse


def test_torch_compile_fullgraph_inductor():
    case = make_case(batch=3, q_len=4, heads=16, kv_dtype=torch.float8_e4m3fn, page_size=64,
                     kv_lens=(0, 37, 300), device="cuda", seed=31)
    args = (case["q"], case["kv_cache"], case["kv_len"], case["block_table"])
    compiled = torch.compile(Attention(), fullgraph=True)
    out, lse = compiled(*args)
    check(case, out / 2, lse)
    case["kv_len"].copy_(torch.tensor([300, 5, 1], dtype=torch.int32))
    out, lse = compiled(*args)  # same graph, new lengths
    check(case, out / 2, lse)
