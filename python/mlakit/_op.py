"""torch.ops.mlakit.decode and torch.ops.mlakit.merge_states: each op's schema, fake (meta)
implementation, CUDA implementation (the compiled extension) and CPU implementation (the
float32 reference).

Schema (mutable outputs, nothing returned):

    mlakit::decode(Tensor q, Tensor kv_cache, Tensor? block_table, Tensor? kv_indptr,
                   Tensor? kv_indices, Tensor kv_len, Tensor(a!) out, Tensor(b!)? lse,
                   float softmax_scale, float kv_scale=1., bool causal=True,
                   str split_mode="auto", int num_splits=0, Tensor(c!)? workspace=None,
                   str lse_format="natural", Tensor? kv_rope=None,
                   str plan_step="plan_and_decode", str compute="standard") -> ()

    mlakit::merge_states(Tensor part_o, Tensor part_lse, Tensor(a!) out,
                         Tensor(b!)? out_lse=None) -> ()

lse_format says how decode writes lse: "natural" (ln, -inf for a row without keys), "natural_empty_is_inf"
(FlashMLA's +inf there) or "base2" (FlashInfer's log2); the kernels write it so, with no extra pass.
plan_step says which steps run: "plan_and_decode", "plan_only" (the split plan into the workspace)
or "decode_only" (the plan a call of the same shape and lengths left there; checked on the host
against mlakit._workspace's record, docs/integration.md "One plan per step").
compute is "standard" (16-bit operands) or "fp8_matrix" (the library's opt-in fp8 matrix mode:
float8_e4m3fn caches on sm_90a; the CPU implementation computes the reference either way).
kv_rope, when given, is a separate cache of the 64 rotary values per row ([pages, page_size, 64],
kv_cache then [pages, page_size, 512]), read in place as FlashInfer keeps its ckv and kpe caches.
The ops write `out` (and `lse` / `out_lse` when given) in place, so engines keep their own
output buffers and CUDA graphs see fixed addresses; mlakit.decode() and mlakit.merge_states()
are the functional wrappers that allocate them. The decode workspace is scratch: pass one, or
leave None to use the per-device cache of mlakit._workspace.
"""
import math

import torch

from . import _ext, _workspace
from ._checks import (COMPUTES, LSE_FORMATS, PLAN_STEPS, SPLIT_MODES, ArgumentError, check_decode_args,
                      check_merge_args)
from .reference import decode_reference, merge_states_reference

_SCHEMA = ("(Tensor q, Tensor kv_cache, Tensor? block_table, Tensor? kv_indptr, Tensor? kv_indices, "
           "Tensor kv_len, Tensor(a6!) out, Tensor(a7!)? lse, float softmax_scale, float kv_scale=1., "
           "bool causal=True, str split_mode=\"auto\", SymInt num_splits=0, "
           "Tensor(a13!)? workspace=None, str lse_format=\"natural\", Tensor? kv_rope=None, "
           "str plan_step=\"plan_and_decode\", str compute=\"standard\") -> ()")
_MUTATED = ("out", "lse", "workspace")

# Registered piece by piece (define, fake, per-device kernels, Autograd and ADInplaceOrView
# kernels) rather than with torch.library.custom_op: in PyTorch 2.11 (fixed by 2.15),
# custom_op's ADInplaceOrView kernel for a mutable op reads the written arguments at their
# schema positions, but the dispatcher hands a Python kernel the positional arguments without
# the trailing ones equal to their defaults. A call with workspace=None (the default, and the
# usual call) failed there with "IndexError: tuple index out of range", however the caller
# passed it. The kernel below looks only at the arguments it was given.
_lib = torch.library.Library("mlakit", "FRAGMENT")
_AFTER_AD_INPLACE_OR_VIEW = torch._C._after_ADInplaceOrView_keyset
_AFTER_AUTOGRAD = torch._C._after_autograd_keyset


def _define(name, schema, mutated):
    """Defines op `name` with its ADInplaceOrView and Autograd kernels; returns the overload."""
    _lib.define(name + schema, tags=(torch.Tag.pt2_compliant_tag,))
    op = getattr(torch.ops.mlakit, name).default
    index = tuple(i for i, a in enumerate(op._schema.arguments) if a.name in mutated)

    def ad_inplace_or_view(keyset, *args, **kwargs):
        """Bumps the version counters of the written tensors that the call has, then goes on
        to the device kernel; the dispatcher passes positional arguments in args, without
        trailing ones left at their defaults."""
        written = [args[i] for i in index if i < len(args)]
        written += [kwargs[n] for n in mutated if n in kwargs]
        tensors = [t for t in written if isinstance(t, torch.Tensor)]
        if tensors:
            torch.autograd.graph.increment_version(tensors)
        return op.redispatch(keyset & _AFTER_AD_INPLACE_OR_VIEW, *args, **kwargs)

    def autograd(keyset, *args, **kwargs):
        """No derivative: runs the kernels below autograd, so the written tensors get no graph
        (as custom_op's autograd kernel without a registered backward)."""
        with torch._C._AutoDispatchBelowAutograd():
            return op.redispatch(keyset & _AFTER_AUTOGRAD, *args, **kwargs)

    _lib.impl(name, ad_inplace_or_view, "ADInplaceOrView", with_keyset=True)
    _lib.impl(name, autograd, "Autograd", with_keyset=True)
    return op


decode_op = _define("decode", _SCHEMA, _MUTATED)


def _decode_not_supported(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                          softmax_scale, kv_scale=1.0, causal=True, split_mode="auto", num_splits=0,
                          workspace=None, lse_format="natural", kv_rope=None,
                          plan_step="plan_and_decode", compute="standard"):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace, lse_format,
                      kv_rope, plan_step, compute)
    raise _ext.Error(f"mlakit.decode runs on CUDA (and on CPU through the reference), not on {q.device.type}",
                     "not_supported")


# Devices without a kernel of their own (as custom_op's default implementation would be).
_lib.impl("decode", _decode_not_supported, "CompositeExplicitAutograd")


@torch.library.register_fake("mlakit::decode", lib=_lib)
def _decode_fake(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                 kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None,
                 lse_format="natural", kv_rope=None, plan_step="plan_and_decode", compute="standard"):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace, lse_format,
                      kv_rope, plan_step, compute)


@torch.library.register_kernel("mlakit::decode", "cuda", lib=_lib)
def _decode_cuda(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                 kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None,
                 lse_format="natural", kv_rope=None, plan_step="plan_and_decode", compute="standard"):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace, lse_format,
                      kv_rope, plan_step, compute)
    ext = _ext.require()
    split_code = SPLIT_MODES[split_mode]
    batch, q_len, heads = q.shape[0], q.shape[1], q.shape[2]
    if batch == 0:
        return
    if workspace is None:
        workspace = _workspace.buffer_for(q.device, batch, heads * q_len, split_code, num_splits)
    key = _workspace.plan_key(q, kv_cache, block_table, kv_indptr, kv_len, causal, split_code,
                              num_splits, kv_rope, compute)
    if plan_step == "decode_only" and _workspace.plan_in(workspace) != key:
        raise ArgumentError("plan_step = 'decode_only': the workspace holds no plan of this call "
                            "(batch, heads, q_len, dtypes, page size, causal, split mode, kv_len and "
                            "page-id tensors and versions): plan first (plan_and_decode or plan_only) "
                            "into the same workspace, in the same CUDA graph capture or, eagerly, "
                            "outside any")
    code, name, message = ext.decode(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out,
                                     lse, workspace, float(softmax_scale), float(kv_scale),
                                     bool(causal), split_code, int(num_splits),
                                     LSE_FORMATS[lse_format], kv_rope, PLAN_STEPS[plan_step],
                                     COMPUTES[compute])
    if code != 0:
        _workspace.note_plan(workspace, None)
        _ext.raise_status(name, message)
    if plan_step != "decode_only":
        _workspace.note_plan(workspace, key)


@torch.library.register_kernel("mlakit::decode", "cpu", lib=_lib)
def _decode_cpu(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse, softmax_scale,
                kv_scale=1.0, causal=True, split_mode="auto", num_splits=0, workspace=None,
                lse_format="natural", kv_rope=None, plan_step="plan_and_decode", compute="standard"):
    check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split_mode, num_splits, workspace, lse_format,
                      kv_rope, plan_step, compute)
    if plan_step == "plan_only":
        return
    o, l = decode_reference(q, kv_cache, kv_len, block_table=block_table, kv_indptr=kv_indptr,
                            kv_indices=kv_indices, softmax_scale=softmax_scale, kv_scale=kv_scale,
                            causal=causal, kv_rope=kv_rope)
    out.copy_(o)
    if lse is not None:
        if lse_format == "base2":
            l = l * (1.0 / math.log(2.0))
        elif lse_format == "natural_empty_is_inf":
            l = torch.where(l == -math.inf, math.inf, l)
        lse.copy_(l)


# ---- merge_states ------------------------------------------------------------------------------

_MERGE_SCHEMA = "(Tensor part_o, Tensor part_lse, Tensor(a2!) out, Tensor(a3!)? out_lse=None) -> ()"
merge_states_op = _define("merge_states", _MERGE_SCHEMA, ("out", "out_lse"))


def _merge_not_supported(part_o, part_lse, out, out_lse=None):
    check_merge_args(part_o, part_lse, out, out_lse)
    raise _ext.Error(f"mlakit.merge_states runs on CUDA (and on CPU through the reference), not on "
                     f"{part_o.device.type}", "not_supported")


_lib.impl("merge_states", _merge_not_supported, "CompositeExplicitAutograd")


@torch.library.register_fake("mlakit::merge_states", lib=_lib)
def _merge_fake(part_o, part_lse, out, out_lse=None):
    check_merge_args(part_o, part_lse, out, out_lse)


@torch.library.register_kernel("mlakit::merge_states", "cuda", lib=_lib)
def _merge_cuda(part_o, part_lse, out, out_lse=None):
    check_merge_args(part_o, part_lse, out, out_lse)
    if part_o.shape[1] == 0:
        return
    code, name, message = _ext.require().merge_states(part_o, part_lse, out, out_lse)
    if code != 0:
        _ext.raise_status(name, message)


@torch.library.register_kernel("mlakit::merge_states", "cpu", lib=_lib)
def _merge_cpu(part_o, part_lse, out, out_lse=None):
    check_merge_args(part_o, part_lse, out, out_lse)
    o, l = merge_states_reference(part_o, part_lse)
    out.copy_(o)
    if out_lse is not None:
        out_lse.copy_(l)
