"""Argument checks of torch.ops.mlakit.decode, shared by the fake (meta), CPU and CUDA
implementations so that every one of them rejects the same calls with the same message.

They read shapes, dtypes, devices and strides only (never tensor data), so they also run on
fake tensors while torch.compile traces. Range checks use the library's message format
("q_len = 40: not in the supported domain (allowed 1..32)"); the library repeats them in C++
(mlakit::validate) together with the checks that need addresses (alignment).
"""
import math
import struct

import torch

HEAD_DIM_QK = 576  # each cache row: 512 latent values, then 64 rotary values
HEAD_DIM_V = 512
MAX_HEADS = 128
MAX_Q_LEN = 32
MAX_PAGE_SIZE = 256
MAX_SPLITS = 64
MAX_BATCH = 65535

Q_DTYPES = (torch.bfloat16, torch.float16)
KV_DTYPES = (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)
SPLIT_MODES = {"auto": 0, "none": 1, "fixed": 2}
# mlakit::LseFormat: how the op writes lse (natural log; natural log with +inf for a row without
# keys, FlashMLA's convention; base 2, FlashInfer's default).
LSE_FORMATS = {"natural": 0, "natural_empty_is_inf": 1, "base2": 2}
# mlakit::PlanStep: which steps a decode call enqueues (plan into the workspace, decode, or both).
PLAN_STEPS = {"plan_and_decode": 0, "plan_only": 1, "decode_only": 2}
# mlakit::Compute: how the products are computed (16-bit operands, or the opt-in fp8 matrix mode,
# both products on e4m3 tensor cores: an float8_e4m3fn cache on sm_90a only).
COMPUTES = {"standard": 0, "fp8_matrix": 1}


class Error(RuntimeError):
    """A failure reported by mlakit. `code` is the library's StatusCode name
    ("invalid_argument", "not_supported", "workspace_too_small", "runtime_error")."""

    def __init__(self, message, code="runtime_error"):
        super().__init__(message)
        self.code = code


class ArgumentError(Error, ValueError):
    """An argument outside what mlakit accepts; the message names it, its value and the
    allowed range."""

    def __init__(self, message):
        super().__init__(message, "invalid_argument")


def _domain(name, value, allowed):
    return ArgumentError(f"{name} = {value}: not in the supported domain ({allowed})")


def _check_range(name, value, lo, hi):
    if not lo <= value <= hi:
        raise _domain(name, value, f"allowed {lo}..{hi}")


def _check_scale(name, value):
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise _domain(name, value, "finite and > 0")


def _f32(x):
    # x rounded to fp32 (inf beyond its range). Plain Python, so that tracing sees no tensor op.
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


_LOG2E_F32 = _f32(math.log2(math.e))


def _check_score_factor(softmax_scale, kv_scale):
    # The kernels take softmax_scale x kv_scale x log2(e) as one fp32 factor: it must be finite.
    # Below 2.3e38 the double product leaves fp32's product finite whatever the rounding (the
    # bound is 2.36e38), so only calls near it pay for the exact fp32 products (each product of
    # two fp32 values is exact in a double, so rounding it gives fp32's product).
    if softmax_scale * kv_scale < 2.3e38:
        return
    if not math.isfinite(_f32(_f32(_f32(softmax_scale) * _f32(kv_scale)) * _LOG2E_F32)):
        raise _domain("softmax_scale x kv_scale", f"{softmax_scale} x {kv_scale}",
                      "a product below about 2.36e38")


def _shape(t):
    return list(t.shape)


def _tensor(name, t, device, dims, dtypes=None, dtype_names=None):
    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{name}: a tensor is required, got {type(t).__name__}")
    if t.device != device:
        raise ArgumentError(f"{name} is on {t.device}, q on {device}: all tensors must be on one device")
    if t.dim() not in dims:
        want = " or ".join(str(d) for d in dims)
        raise ArgumentError(f"{name} has shape {_shape(t)}: expected {want} dimensions")
    if dtypes is not None and t.dtype not in dtypes:
        raise ArgumentError(f"{name}: dtype {t.dtype} is not supported (allowed: {dtype_names})")


def _index(name, t, device, dims, rows):
    _tensor(name, t, device, dims, (torch.int32,), "torch.int32")
    if t.shape[0] != rows:
        raise ArgumentError(f"{name} has shape {_shape(t)}: expected {rows} rows")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ArgumentError(f"{name}: its last dimension must be contiguous (stride {t.stride(-1)})")


def _check_rope_cache(kv_cache, kv_rope, device):
    """kv_cache [pages, page_size, (1,) 512] with its rotary part kv_rope [pages, page_size,
    (1,) 64]: the same pages and page size, the same dtype and device."""
    _tensor("kv_rope", kv_rope, device, (3, 4), (kv_cache.dtype,), str(kv_cache.dtype) + " (kv_cache's dtype)")
    rope_dim = HEAD_DIM_QK - HEAD_DIM_V
    if kv_rope.dim() != kv_cache.dim() or (kv_rope.dim() == 4 and kv_rope.shape[2] != 1):
        raise ArgumentError(f"kv_rope has shape {_shape(kv_rope)}: expected {_shape(kv_cache)[:-1] + [rope_dim]} "
                            "(kv_cache's pages and page size, 64 rotary values per row)")
    if kv_cache.shape[-1] != HEAD_DIM_V:
        raise ArgumentError(f"kv_cache has shape {_shape(kv_cache)}: with kv_rope given, expected "
                            "[pages, page_size, 512] (the latent values of each row)")
    if tuple(kv_rope.shape[:-1]) != tuple(kv_cache.shape[:-1]) or kv_rope.shape[-1] != rope_dim:
        raise ArgumentError(f"kv_rope has shape {_shape(kv_rope)}: expected {_shape(kv_cache)[:-1] + [rope_dim]} "
                            "(kv_cache's pages and page size, 64 rotary values per row)")
    if kv_rope.stride(-1) != 1:
        raise ArgumentError(f"kv_rope: the last dimension must be contiguous (stride {kv_rope.stride(-1)})")


def check_decode_args(q, kv_cache, block_table, kv_indptr, kv_indices, kv_len, out, lse,
                      softmax_scale, kv_scale, causal, split, num_splits, workspace,
                      lse_format="natural", kv_rope=None, plan_step="plan_and_decode",
                      compute="standard"):
    """Raises ArgumentError for a call the op does not accept; returns None otherwise."""
    if not isinstance(q, torch.Tensor):
        raise ArgumentError(f"q: a tensor is required, got {type(q).__name__}")
    device = q.device
    _tensor("q", q, device, (4,), Q_DTYPES, "torch.bfloat16, torch.float16")
    batch, q_len, heads, dim = q.shape
    if dim != HEAD_DIM_QK:
        raise ArgumentError(f"q has shape {_shape(q)}: expected [batch, q_len, heads, 576] "
                            "(512 latent + 64 rotary values per head)")
    if q.stride(3) != 1:
        raise ArgumentError(f"q: the last dimension must be contiguous (stride {q.stride(3)})")
    _check_range("batch", batch, 0, MAX_BATCH)
    _check_range("num_heads", heads, 1, MAX_HEADS)
    _check_range("q_len", q_len, 1, MAX_Q_LEN)

    _tensor("kv_cache", kv_cache, device, (3, 4), KV_DTYPES,
            "torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz")
    if kv_cache.dim() == 4 and kv_cache.shape[2] != 1:
        raise ArgumentError(f"kv_cache has shape {_shape(kv_cache)}: MLA has one latent KV head "
                            "([pages, page_size, 1, 576])")
    if kv_rope is not None:
        _check_rope_cache(kv_cache, kv_rope, device)
    elif kv_cache.shape[-1] != HEAD_DIM_QK:
        hint = ""
        if kv_cache.shape[-1] in (HEAD_DIM_V, HEAD_DIM_QK - HEAD_DIM_V):
            hint = ("; a view such as kv[..., :512] or kv[..., 512:] is one part of the cache: pass "
                    "the whole 576-wide row (mlakit.join_latent_cache joins two such views), or the "
                    "512 latent values as kv_cache and the 64 rotary values as kv_rope")
        raise ArgumentError(f"kv_cache has shape {_shape(kv_cache)}: expected [pages, page_size, 576] "
                            f"(each row 512 latent + 64 rotary values){hint}")
    if kv_cache.stride(-1) != 1:
        raise ArgumentError(f"kv_cache: the last dimension must be contiguous (stride {kv_cache.stride(-1)})")
    _check_range("page_size", kv_cache.shape[1], 1, MAX_PAGE_SIZE)

    _tensor("out", out, device, (4,), (q.dtype,), str(q.dtype) + " (q's dtype)")
    if tuple(out.shape) != (batch, q_len, heads, HEAD_DIM_V):
        raise ArgumentError(f"out has shape {_shape(out)}: expected {[batch, q_len, heads, HEAD_DIM_V]}")
    if out.stride(3) != 1:
        raise ArgumentError(f"out: the last dimension must be contiguous (stride {out.stride(3)})")
    if lse is not None:
        _tensor("lse", lse, device, (3,), (torch.float32,), "torch.float32")
        if tuple(lse.shape) != (batch, q_len, heads):
            raise ArgumentError(f"lse has shape {_shape(lse)}: expected {[batch, q_len, heads]}")

    has_table = block_table is not None
    has_csr = kv_indptr is not None or kv_indices is not None
    if has_table == has_csr or (has_csr and (kv_indptr is None or kv_indices is None)):
        raise ArgumentError("page ids: give either block_table [batch, max_pages] or both kv_indptr "
                            "[batch + 1] and kv_indices")
    if has_table:
        _index("block_table", block_table, device, (2,), batch)
        if block_table.shape[1] < 1:
            raise ArgumentError(f"block_table has shape {_shape(block_table)}: needs at least one page per request")
    else:
        _index("kv_indptr", kv_indptr, device, (1,), batch + 1)
        _index("kv_indices", kv_indices, device, (1,), kv_indices.shape[0] if isinstance(kv_indices, torch.Tensor) else 0)
    _index("kv_len", kv_len, device, (1,), batch)

    _check_scale("softmax_scale", softmax_scale)
    _check_scale("kv_scale", kv_scale)
    _check_score_factor(softmax_scale, kv_scale)
    if not isinstance(causal, bool):
        raise ArgumentError(f"causal = {causal!r}: True or False")
    if split not in SPLIT_MODES:
        raise _domain("split_mode", repr(split), "'auto', 'none' or 'fixed'")
    if split == "fixed":
        _check_range("num_splits", num_splits, 1, MAX_SPLITS)
        if batch > 0 and batch * num_splits > MAX_BATCH:
            raise _domain("num_splits", num_splits, f"batch x num_splits <= {MAX_BATCH} (batch {batch})")
    if workspace is not None:
        _tensor("workspace", workspace, device, (1,))
        if not workspace.is_contiguous():
            raise ArgumentError("workspace: must be contiguous")
    if not isinstance(lse_format, str) or lse_format not in LSE_FORMATS:
        raise _domain("lse_format", repr(lse_format), "'natural', 'natural_empty_is_inf' or 'base2'")
    if not isinstance(plan_step, str) or plan_step not in PLAN_STEPS:
        raise _domain("plan_step", repr(plan_step), "'plan_and_decode', 'plan_only' or 'decode_only'")
    if not isinstance(compute, str) or compute not in COMPUTES:
        raise _domain("compute", repr(compute), "'standard' or 'fp8_matrix'")
    if compute == "fp8_matrix" and kv_cache.dtype != torch.float8_e4m3fn:
        raise _domain("compute", repr(compute),
                      f"a torch.float8_e4m3fn cache (kv_cache is {kv_cache.dtype}); 'standard' serves every cache")


# ---- merge_states ------------------------------------------------------------------------------

MERGE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
MAX_MERGE_PARTS = 4096
MAX_MERGE_TOKENS = 2147483647
MAX_MERGE_HEADS = 65535
MAX_MERGE_HEAD_DIM = 16384
MERGE_HEAD_DIM_MULTIPLE = 8


def check_merge_args(part_o, part_lse, out, out_lse):
    """Raises ArgumentError for a merge_states call the op does not accept (shapes, dtypes,
    devices, ranges; the library checks strides and alignment again)."""
    if not isinstance(part_o, torch.Tensor):
        raise ArgumentError(f"part_o: a tensor is required, got {type(part_o).__name__}")
    device = part_o.device
    names = "torch.bfloat16, torch.float16, torch.float32"
    _tensor("part_o", part_o, device, (4,), MERGE_DTYPES, names)
    parts, tokens, heads, dim = part_o.shape
    _check_range("num_parts", parts, 1, MAX_MERGE_PARTS)
    _check_range("num_tokens", tokens, 0, MAX_MERGE_TOKENS)
    _check_range("num_heads", heads, 1, MAX_MERGE_HEADS)
    if not (MERGE_HEAD_DIM_MULTIPLE <= dim <= MAX_MERGE_HEAD_DIM
            and dim % MERGE_HEAD_DIM_MULTIPLE == 0):
        raise _domain("head_dim", dim, f"{MERGE_HEAD_DIM_MULTIPLE}..{MAX_MERGE_HEAD_DIM}, a multiple of "
                      f"{MERGE_HEAD_DIM_MULTIPLE}")
    if part_o.stride(3) != 1:
        raise ArgumentError(f"part_o: the last dimension must be contiguous (stride {part_o.stride(3)})")
    _tensor("part_lse", part_lse, device, (3,), (torch.float32,), "torch.float32")
    if tuple(part_lse.shape) != (parts, tokens, heads):
        raise ArgumentError(f"part_lse has shape {_shape(part_lse)}: expected "
                            f"{[parts, tokens, heads]} (part_o's first three dimensions)")
    _tensor("out", out, device, (3,), MERGE_DTYPES, names)
    if tuple(out.shape) != (tokens, heads, dim):
        raise ArgumentError(f"out has shape {_shape(out)}: expected {[tokens, heads, dim]}")
    if out.stride(2) != 1:
        raise ArgumentError(f"out: the last dimension must be contiguous (stride {out.stride(2)})")
    if out_lse is not None:
        _tensor("out_lse", out_lse, device, (2,), (torch.float32,), "torch.float32")
        if tuple(out_lse.shape) != (tokens, heads):
            raise ArgumentError(f"out_lse has shape {_shape(out_lse)}: expected {[tokens, heads]}")
