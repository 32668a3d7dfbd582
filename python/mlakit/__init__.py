"""mlakit for PyTorch: MLA decode attention (one latent KV head, 576-wide cache rows, V the
first 512 values) for multi-token queries over a paged cache, as the custom op
torch.ops.mlakit.decode.

    out, lse = mlakit.decode(q, kv_cache, kv_len, block_table=block_table,
                             softmax_scale=scale, return_lse=True)

mlakit.merge_states merges partial results (O, LSE) computed over separate parts of the keys
(context-parallel decode, cascade attention), as torch.ops.mlakit.merge_states.

Adapters: mlakit.flashmla (FlashMLA's get_mla_metadata / flash_mla_with_kvcache) and
mlakit.flashinfer (FlashInfer's BatchMLAPagedAttentionWrapper, as SGLang and vLLM call it).
See docs/integration.md in the repository.
"""
import torch

from . import _ext
from ._checks import (HEAD_DIM_QK, HEAD_DIM_V, KV_DTYPES, MAX_BATCH, MAX_HEADS, MAX_PAGE_SIZE,
                      MAX_Q_LEN, MAX_SPLITS, MERGE_DTYPES, Q_DTYPES, ArgumentError, Error)
from ._op import decode_op, merge_states_op  # noqa: F401  (importing it registers the ops)
from ._workspace import release_workspaces, workspace
from .reference import decode_reference, merge_states_reference

__version__ = "0.1.0"

__all__ = [
    "decode", "decode_reference", "merge_states", "merge_states_reference", "workspace",
    "release_workspaces", "join_latent_cache", "join_q", "has_cuda_extension", "Error",
    "ArgumentError", "HEAD_DIM_QK", "HEAD_DIM_V", "MAX_HEADS", "MAX_Q_LEN", "MAX_PAGE_SIZE",
    "MAX_SPLITS", "MAX_BATCH", "Q_DTYPES", "KV_DTYPES", "MERGE_DTYPES",
]


def has_cuda_extension():
    """True when the compiled CUDA extension (mlakit._C) was built and loads."""
    return _ext._C is not None


def decode(q, kv_cache, kv_len, *, block_table=None, kv_indptr=None, kv_indices=None,
           softmax_scale, kv_scale=1.0, causal=True, split="auto", num_splits=0,
           return_lse=False, out=None, lse=None, workspace=None, lse_format="natural",
           kv_rope=None, plan_step="plan_and_decode", compute="standard"):
    """MLA decode attention; returns out, or (out, lse) when return_lse or lse is given.

    q          [batch, q_len, heads, 576], bf16 or fp16; q_len 1..32, heads 1..128
    kv_cache   [pages, page_size, 576] or [pages, page_size, 1, 576]: bf16, fp16,
               float8_e4m3fn or float8_e4m3fnuz; page_size 1..256
    kv_rope    optional [pages, page_size, 64] (or [..., 1, 64]): the rotary values in a cache
               of their own, kv_cache then holding the 512 latent values of each row (FlashInfer's
               ckv / kpe caches); both read in place
    kv_len     [batch] int32 on the device: cached tokens per request, the q_len new ones
               included (clamped on the device to the request's page capacity and 2^30)
    block_table [batch, max_pages] int32, or kv_indptr [batch + 1] with kv_indices (CSR)
    softmax_scale  multiplies Q.K; kv_scale multiplies every cache value (fp8 dequantisation)
    causal     bottom-right aligned: token t sees keys j <= kv_len - q_len + t
    split      "auto" (device planner), "none", or "fixed" with num_splits 1..64
    out / lse  optional outputs to write: out [batch, q_len, heads, 512] (q's dtype), lse
               [batch, q_len, heads] float32
    lse_format "natural" (ln, -inf for a row with no key), "natural_empty_is_inf" (+inf there,
               FlashMLA's convention) or "base2" (log2, FlashInfer's default)
    plan_step  "plan_and_decode"; "plan_only" (the split plan into the workspace, no output) or
               "decode_only" (the plan already in the workspace): the layers of one model step
               share a plan, so the first plans and the others skip the planner kernel. A
               decode_only call raises ArgumentError unless the last call that planned into its
               workspace had the same shape, dtypes, page size, causal, split mode and the same
               kv_len and page-id tensors, unmodified (docs/integration.md, "One plan per step")
    compute    "standard" (16-bit operands, f32 accumulation) or "fp8_matrix": the library's opt-in
               fp8 matrix mode, both products on e4m3 tensor cores, for a float8_e4m3fn cache on
               sm_90a (relative error up to about 1.6e-2 on N(0,1) data; not yet faster, and
               about 1.3x slower where fewer than 64 rows share a tile, e.g. 16 heads at q_len
               1 or 2: the library's docs/design.md and docs/performance.md, "The fp8 matrix
               mode")
    Strides come from the tensors: views are accepted wherever the library's stride rules allow.
    """
    if out is None:
        if not isinstance(q, torch.Tensor) or q.dim() != 4:
            shape = list(q.shape) if isinstance(q, torch.Tensor) else type(q).__name__
            raise ArgumentError(f"q has shape {shape}: expected [batch, q_len, heads, 576]")
        out = q.new_empty((q.shape[0], q.shape[1], q.shape[2], HEAD_DIM_V))
    if return_lse and lse is None:
        lse = torch.empty((q.shape[0], q.shape[1], q.shape[2]), dtype=torch.float32, device=q.device)
    torch.ops.mlakit.decode(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                            softmax_scale, kv_scale, causal, split, num_splits, workspace,
                            lse_format, kv_rope, plan_step, compute)
    return (out, lse) if lse is not None else out


def merge_states(part_o, part_lse, *, out=None, out_lse=None, return_lse=False, out_dtype=None):
    """Merges N partial attention results per row into one; returns out, or (out, lse) when
    return_lse or out_lse is given.

    part_o     [N, tokens, heads, D] bf16, fp16 or fp32: each part's output, normalised by its
               own softmax sum (what decode() writes for its part of the keys); D 8..16384, a
               multiple of 8; N 1..4096
    part_lse   [N, tokens, heads] float32, natural log; -inf (or FlashMLA's +inf) marks an empty
               part, whose O is not read
    out        [tokens, heads, D] (dtype out_dtype, default part_o's), out_lse [tokens, heads]
               float32: sum_p exp(lse_p - lse) o_p and lse = log sum_p exp(lse_p); O = 0 and
               LSE = -inf for a row whose parts are all empty
    Parts are added in increasing order, so the result is bitwise repeatable; strides come from
    the tensors (out_lse may be [heads, tokens] transposed, say). One kernel, no allocation
    inside: capture-safe.
    """
    if out is None:
        if not isinstance(part_o, torch.Tensor) or part_o.dim() != 4:
            shape = list(part_o.shape) if isinstance(part_o, torch.Tensor) else type(part_o).__name__
            raise ArgumentError(f"part_o has shape {shape}: expected [parts, tokens, heads, head_dim]")
        out = part_o.new_empty(part_o.shape[1:], dtype=out_dtype or part_o.dtype)
    if return_lse and out_lse is None:
        out_lse = torch.empty(out.shape[:2], dtype=torch.float32, device=out.device)
    torch.ops.mlakit.merge_states(part_o, part_lse, out, out_lse)
    return (out, out_lse) if out_lse is not None else out


def _adjacent(first, second, offset):
    """True when `second` is the view of the same rows as `first`, `offset` elements later."""
    return (first.dtype == second.dtype and first.device == second.device
            and first.shape[:-1] == second.shape[:-1] and first.stride() == second.stride()
            and first.untyped_storage().data_ptr() == second.untyped_storage().data_ptr()
            and second.storage_offset() == first.storage_offset() + offset)


def join_latent_cache(ckv_cache, kpe_cache):
    """The 576-wide cache view [..., 576] behind two views of it: ckv_cache = kv[..., :512]
    (latent) and kpe_cache = kv[..., 512:] (rotary), as FlashInfer-style backends pass them.
    No copy; raises ArgumentError when the two are not parts of the same rows."""
    if ckv_cache.shape[-1] != HEAD_DIM_V or kpe_cache.shape[-1] != HEAD_DIM_QK - HEAD_DIM_V:
        raise ArgumentError(f"ckv_cache {list(ckv_cache.shape)} and kpe_cache {list(kpe_cache.shape)}: "
                            "expected last dimensions 512 and 64")
    if not _adjacent(ckv_cache, kpe_cache, HEAD_DIM_V):
        raise ArgumentError("ckv_cache and kpe_cache are not the two parts of one cache row: mlakit reads "
                            "576-wide rows (512 latent then 64 rotary values), so kpe_cache must start 512 "
                            "elements after ckv_cache with the same strides (kv[..., :512], kv[..., 512:]); "
                            "pass two separate tensors to decode() as kv_cache and kv_rope instead")
    return ckv_cache.as_strided(tuple(ckv_cache.shape[:-1]) + (HEAD_DIM_QK,), ckv_cache.stride(),
                                ckv_cache.storage_offset())


def join_q(q_nope, q_pe):
    """Q [..., 576] from its latent part [..., 512] and rotary part [..., 64]: a view when
    they are adjacent parts of one tensor, else a concatenated copy."""
    if (q_nope.shape[-1] == HEAD_DIM_V and q_pe.shape[-1] == HEAD_DIM_QK - HEAD_DIM_V
            and _adjacent(q_nope, q_pe, HEAD_DIM_V)):
        return q_nope.as_strided(tuple(q_nope.shape[:-1]) + (HEAD_DIM_QK,), q_nope.stride(),
                                 q_nope.storage_offset())
    return torch.cat([q_nope, q_pe], dim=-1)
