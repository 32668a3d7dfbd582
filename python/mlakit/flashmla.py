"""FlashMLA's Python interface on top of torch.ops.mlakit.decode, for engines that call
`get_mla_metadata` / `flash_mla_with_kvcache` (dense decode, one latent KV head):

    from mlakit.flashmla import get_mla_metadata, flash_mla_with_kvcache

Same arguments and outputs: q [b, s_q, h_q, 576], k_cache [blocks, page_block_size, 1, 576],
block_table [b, max_blocks] int32, cache_seqlens [b] int32, head_dim_v 512; returns
out [b, s_q, h_q, 512] and softmax_lse [b, h_q, s_q] float32 (+inf for a row that sees no key,
as FlashMLA reports it). Both metadata styles are accepted: the older
get_mla_metadata(cache_seqlens, s_q * h_q // h_k, h_k) -> (metadata, num_splits) and the newer
argument-free get_mla_metadata() -> (metadata, None). mlakit plans splits on the device: the
metadata carries the workspace (when given the older arguments outside a CUDA graph capture,
get_mla_metadata sizes it, which makes a following capture safe) and, as FlashMLA's schedule
does, one plan for every call made with it: the first call plans, later ones (the other layers
of the step) decode with that plan while the workspace holds it for the same shape and the same
cache_seqlens tensor, unmodified.

The call launches exactly the kernels torch.ops.mlakit.decode launches for it: out and
softmax_lse are written in place through strides (no copy, transpose or extra allocation), the
+inf of a row that sees no key by the kernels themselves (lse_format="natural_empty_is_inf";
empty_lse=-math.inf asks for mlakit's -inf instead). Nothing is read back to the host, so the
call captures in a CUDA graph.

Not supported (ArgumentError): FlashMLA's own fp8 cache layout (is_fp8_kvcache=True, 656
bytes per token), sparse attention (indices, topk_length, extra_k_cache, attn_sink) and
descale_q. A float8_e4m3fn k_cache with one scale is: pass descale_k (a float, or a
one-element tensor, read on the host once per tensor and version: outside a capture first)
or kv_scale; a tensor made under torch.inference_mode keeps no version and is read once.

One keyword FlashMLA does not have: compute="fp8_matrix" selects the library's opt-in fp8
matrix mode for a float8_e4m3fn k_cache (mlakit.decode's `compute`; "standard" by default).
"""
import math
import weakref

import torch

from . import _ext, _workspace
from ._checks import HEAD_DIM_V, ArgumentError

__all__ = ["get_mla_metadata", "flash_mla_with_kvcache", "FlashMLASchedMeta"]


class FlashMLASchedMeta:
    """Scheduling metadata as FlashMLA's callers hold it. mlakit needs none of FlashMLA's tile
    schedule; `workspace` is the buffer sized by get_mla_metadata (None when not sized)."""

    def __init__(self, workspace=None):
        self.workspace = workspace
        self.have_initialized = False


def get_mla_metadata(cache_seqlens=None, num_q_tokens_per_head_k=None, num_heads_k=1, *args, **kwargs):
    """Returns (FlashMLASchedMeta, None). With the older arguments, on a CUDA device and outside
    a CUDA graph capture, it also sizes the decode workspace for this batch and row count."""
    if cache_seqlens is None:
        cache_seqlens = kwargs.get("cache_seqlens")
    if num_q_tokens_per_head_k is None:
        num_q_tokens_per_head_k = kwargs.get("num_q_tokens_per_head_k", kwargs.get("num_heads_per_head_k"))
    num_heads_k = kwargs.get("num_heads_k", num_heads_k)
    meta = FlashMLASchedMeta()
    if (isinstance(cache_seqlens, torch.Tensor) and cache_seqlens.is_cuda and num_q_tokens_per_head_k
            and _ext._C is not None):
        rows = int(num_q_tokens_per_head_k) * int(num_heads_k)
        with torch.cuda.device(cache_seqlens.device):
            capturing = torch.cuda.is_current_stream_capturing()
        if not capturing and cache_seqlens.shape[0] > 0:
            meta.workspace = _workspace.buffer_for(cache_seqlens.device, cache_seqlens.shape[0], rows, 0, 0)
    return meta, None


# Host copies of scale tensors, read once per tensor and version: a CUDA tensor is read on the
# host (a synchronisation) the first time only, and never during a CUDA graph capture.
_scales = {}  # id(tensor) -> (weak reference, version, value)


def _scale_value(name, value):
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return float(value)
    if value.numel() != 1:
        raise ArgumentError(f"{name} has shape {list(value.shape)}: one scale per cache expected")
    version = _workspace.tensor_version(value)  # None for an inference tensor: read once
    hit = _scales.get(id(value))
    if hit is not None and hit[0]() is value and hit[1] == version:
        return hit[2]
    if value.is_cuda:
        with torch.cuda.device(value.device):
            if torch.cuda.is_current_stream_capturing():
                raise ArgumentError(f"{name}: a CUDA tensor that was not read before the CUDA graph capture "
                                    "(a first call outside the capture reads it once); or pass a float")
    v = float(value.item())
    if len(_scales) > 4096:
        _scales.clear()
    _scales[id(value)] = (weakref.ref(value), version, v)
    return v


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata=None,
                           num_splits=None, softmax_scale=None, causal=False, *, descale_q=None, descale_k=None,
                           kv_scale=None, is_fp8_kvcache=False, indices=None, attn_sink=None,
                           extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None, out=None, empty_lse=math.inf, compute="standard"):
    """FlashMLA's dense decode call; returns (out [b, s_q, h_q, 512], softmax_lse [b, h_q, s_q]).

    The kernels write out and softmax_lse in place through strides (LSE in FlashMLA's layout),
    so the call launches what torch.ops.mlakit.decode launches for it and nothing else. A row
    without keys gets FlashMLA's +inf with the default empty_lse=math.inf, mlakit's -inf with
    empty_lse=-math.inf (merge_states and vLLM's merge treat both as empty). compute is
    mlakit.decode's ("standard", or "fp8_matrix" for a float8_e4m3fn k_cache)."""
    if head_dim_v != HEAD_DIM_V:
        raise ArgumentError(f"head_dim_v = {head_dim_v}: not in the supported domain (512)")
    if is_fp8_kvcache:
        raise ArgumentError("is_fp8_kvcache = True: FlashMLA's fp8 cache layout (656 bytes per token, "
                            "per-tile scales) is not supported; mlakit reads float8_e4m3fn caches of 576 "
                            "values per token with one kv_scale")
    sparse = dict(indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
                  extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
                  extra_topk_length=extra_topk_length)
    given = [k for k, v in sparse.items() if v is not None]
    if given:
        raise ArgumentError(f"{', '.join(given)}: sparse attention is not supported by mlakit")
    if descale_q is not None:
        raise ArgumentError("descale_q: fp8 queries are not supported (q is bf16 or fp16)")
    if block_table is None or cache_seqlens is None:
        raise ArgumentError("block_table and cache_seqlens are required for dense decode")
    if empty_lse not in (math.inf, -math.inf):
        raise ArgumentError(f"empty_lse = {empty_lse!r}: not in the supported domain (math.inf as FlashMLA, "
                            "or -math.inf)")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        shape = list(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
        raise ArgumentError(f"q has shape {shape}: expected [batch, s_q, h_q, 576]")
    scale = _scale_value("descale_k", descale_k) if kv_scale is None else float(kv_scale)
    if softmax_scale is None:
        softmax_scale = q.shape[-1] ** -0.5
    b, s_q, h_q = q.shape[0], q.shape[1], q.shape[2]
    # The first call with a metadata object plans; later calls with it (the other layers of the
    # step, as FlashMLA computes its schedule once per metadata) reuse that plan where the
    # workspace still holds it for the same shape and the same cache_seqlens.
    meta = tile_scheduler_metadata if isinstance(tile_scheduler_metadata, FlashMLASchedMeta) else None
    workspace, step = None, "plan_and_decode"
    if meta is not None and q.is_cuda and b > 0 and _ext._C is not None:
        workspace = meta.workspace
        if workspace is None:
            workspace = _workspace.buffer_for(q.device, b, s_q * h_q, 0, 0)
        key = _workspace.plan_key(q, k_cache, block_table, None, cache_seqlens, bool(causal), 0, 0, None,
                                  compute)
        step = _workspace.step_for(workspace, key, meta.have_initialized)
    if meta is not None:
        meta.have_initialized = True
    # FlashMLA's [b, h_q, s_q], written by the kernels through the [b, s_q, h_q] view.
    softmax_lse = torch.empty((b, h_q, s_q), dtype=torch.float32, device=q.device)
    from . import decode
    out, _ = decode(q, k_cache, cache_seqlens, block_table=block_table, softmax_scale=softmax_scale,
                    kv_scale=1.0 if scale is None else scale, causal=bool(causal), out=out,
                    lse=softmax_lse.transpose(1, 2),
                    lse_format="natural_empty_is_inf" if empty_lse == math.inf else "natural",
                    workspace=workspace, plan_step=step, compute=compute)
    return out, softmax_lse
