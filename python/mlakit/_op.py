"""torch.ops.mlakit.decode: the op's schema, fake (meta) implementation, CUDA implementation
(the compiled extension) and CPU implementation (the float32 reference).

Schema (mutable outputs, nothing returned):

    mlakit::decode(Tensor q, Tensor kv_cache, Tensor? block_table, Tensor? kv_indptr,
                   Tensor? kv_indices, Tensor kv_len, Tensor(a!) out, Tensor(b!)? lse,
                   float softmax_scale, float kv_scale=1., bool causal=True,
                   str split_mode="auto", int num_splits=0, Tensor(c!)? workspace=None) -> ()

The op writes `out` (and `lse` when given) in place, so engines keep their own output
buffers and CUDA graphs see fixed addresses; mlakit.decode() is the functional wrapper that
allocates them. The workspace is scratch: pass one, or leave None to use the per-device
cache of mlakit._workspace.
"""
from typing import Optional

import torch

from . import _ext, _workspace
from ._checks import SPLIT_MODES, check_decode_args
from .reference import decode_reference

_MUTATED = ("out", "lse", "workspace")


@torch.library.custom_op("mlakit::decode", mutates_args=_MUTATED)
def decode_op(q: torch.Tensor, kv_cache: torch.Tensor, block_table: Optional[torch.Tensor],
              kv_indptr: Optional[torch.Tensor], kv_indices: Optional[torch.Tensor],
              kv_len: torch.Tensor, out: torch.Tensor, lse: Optional[torch.Tensor],
              softmax_scale: float, kv_scale: float = 1.0, causal: bool = True,
              split_mode: str = "auto", num_splits: int = 0,
              workspace: Optional[torch.Tensor] = None) -> None:
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace)
    raise _ext.Error(f"mlakit.decode runs on CUDA (and on CPU through the reference), not on {q.device.type}",
                     "not_supported")


@decode_op.register_fake
def _decode_fake(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                 kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace)


@decode_op.register_kernel("cuda")
def _decode_cuda(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                 kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace)
    ext = _ext.require()
    split_code = SPLIT_MODES[split_mode]
    batch, q_len, heads = q.shape[0], q.shape[1], q.shape[2]
    if batch == 0:
        return
    if workspace is None:
        workspace = _workspace.buffer_for(q.device, batch, heads * q_len, split_code, num_splits)
    code, name, message = ext.decode(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out,
                                     lse, workspace, float(softmax_scale), float(kv_scale),
                                     bool(causal), split_code, int(num_splits))
    if code != 0:
        _ext.raise_status(name, message)


@decode_op.register_kernel("cpu")
def _decode_cpu(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace)
    o, l = decode_reference(q, kv_cache, kv_len, block_table=block_table, kv_indptr=kv_indptr,
                            kv_indices=kv_indices, softmax_scale=softmax_scale, kv_scale=kv_scale,
                            causal=causal)
    out.copy_(o)
    if lse is not None:
        lse.copy_(l)
