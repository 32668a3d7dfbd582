"""Graph-safe workspace for torch.ops.mlakit.decode.

One buffer per (device, shape class), where the shape class is what the library's workspace
size depends on besides the batch: rows per request (heads x q_len), the split mode and, for
the fixed mode, the number of splits. The size grows with the batch, so a buffer sized for
batch B serves every smaller batch of its class.

Buffers come from PyTorch's caching allocator on the current stream, and never during a CUDA
graph capture: a call made while capturing finds its buffer already there (allocated by an
earlier call or by mlakit.workspace()) or raises. A buffer that had to grow is kept alive
(not returned to the allocator), since a graph captured earlier may still use it;
release_workspaces() drops them all.

Each workspace also holds the split plan of the last call that planned into it (the library
keeps the plan there: mlakit::PlanStep). plan_key() names what a plan depends on, and
note_plan() / plan_in() record which plan a workspace holds, so that a decode_only call can be
refused when its workspace holds another call's plan and the adapters can tell when the layers of
one step may share a plan. The record sees the host side only: a kv_len or kv_indptr tensor
rewritten by a kernel without a version bump, or an inference tensor (which has no version)
rewritten in place, is not noticed, nor is a graph replayed between two
eager calls that plans into the same workspace. A plan enqueued during a CUDA graph capture
serves only later calls of that capture.
"""
import threading

import torch

from . import _ext
from ._checks import (MAX_BATCH, MAX_HEADS, MAX_Q_LEN, SPLIT_MODES, ArgumentError, Error, _check_range,
                      _domain)

_lock = threading.Lock()
_buffers = {}  # (device index, rows, split code, splits) -> uint8 tensor
_retired = []  # grown-out-of buffers that captured graphs may still use
_sizes = {}  # (device index, batch, rows, split code, splits) -> bytes
_plans = {}  # (device index, workspace address) -> plan_key() of the plan last written there


def tensor_version(t):
    """t's version counter, or None for an inference tensor (made under torch.inference_mode, as
    serving engines make theirs), which keeps none."""
    return None if t.is_inference() else t._version


def _tensor_state(t):
    """A tensor as a plan sees it: address, layout and version (tensor_version)."""
    if t is None:
        return None
    return (t.data_ptr(), tensor_version(t), tuple(t.shape), tuple(t.stride()))


def plan_key(q, kv_cache, block_table, kv_indptr, kv_len, causal, split_code, num_splits, kv_rope,
             compute="standard"):
    """What the library's split plan of a call depends on: the shape, dtypes, page size, causal,
    split mode, arithmetic (its kernel), the device, the kv_len tensor and the page capacity (a
    block table's width, or the kv_indptr tensor). Tensors enter by address, version and layout,
    not by value."""
    return (q.device.index, tuple(q.shape[:3]), q.dtype, kv_cache.dtype, int(kv_cache.shape[1]),
            bool(causal) or q.shape[1] == 1, split_code, num_splits if split_code == SPLIT_MODES["fixed"] else 0,
            kv_rope is None, _tensor_state(kv_len),
            None if block_table is None else int(block_table.shape[1]), _tensor_state(kv_indptr),
            compute)


def _capture_id(device):
    """The capture id of the device's current stream (0 outside a capture), None if unknown."""
    cid = _ext.require().capture_id(device.index)
    return None if cid < 0 else cid


def note_plan(workspace, key):
    """Records that `workspace` holds the plan of `key` (None: no usable plan) for the calls
    that follow in the same CUDA graph capture, or eagerly where none is under way: a plan
    enqueued while capturing is written only when that graph replays."""
    _plans[(workspace.device.index, workspace.data_ptr())] = (
        None if key is None else (key, _capture_id(workspace.device)))
    if len(_plans) > 4096:
        _plans.clear()


def plan_in(workspace):
    """The plan_key() of the plan `workspace` holds for a call made now (same capture, or both
    outside any capture), or None."""
    record = _plans.get((workspace.device.index, workspace.data_ptr()))
    if record is None:
        return None
    key, cid = record
    return key if cid is not None and cid == _capture_id(workspace.device) else None


def step_for(workspace, key, may_reuse):
    """The plan step of an adapter's call: "decode_only" where reuse is allowed (a later layer
    of the same step) and `workspace` holds the plan of `key`, else "plan_and_decode"."""
    return "decode_only" if may_reuse and plan_in(workspace) == key else "plan_and_decode"


def _class_key(device, rows, split_code, num_splits):
    return (device.index, rows, split_code, num_splits if split_code == SPLIT_MODES["fixed"] else 0)


def _bytes(device, batch, rows, split_code, num_splits):
    key = _class_key(device, rows, split_code, num_splits) + (batch,)
    n = _sizes.get(key)
    if n is None:
        n, code, name, message = _ext.require().workspace_bytes(batch, rows, split_code, num_splits, device.index)
        if code != 0:
            _ext.raise_status(name, message)
        _sizes[key] = n
    return n


def buffer_for(device, batch, rows, split_code, num_splits):
    """The workspace of this call's shape class, grown to `batch` requests if needed."""
    need = _bytes(device, batch, rows, split_code, num_splits)
    key = _class_key(device, rows, split_code, num_splits)
    buf = _buffers.get(key)
    if buf is not None and buf.numel() >= need:
        return buf
    with torch.cuda.device(device):
        capturing = torch.cuda.is_current_stream_capturing()
    if capturing:
        split = [k for k, v in SPLIT_MODES.items() if v == split_code][0]
        raise Error(
            f"mlakit.decode during CUDA graph capture needs {need} bytes of workspace for batch {batch}, "
            f"{rows} rows per request (heads x q_len), split {split!r}, and none was allocated before the "
            f"capture: call mlakit.workspace(batch={batch}, num_heads=..., q_len=..., split={split!r}) "
            "(or run the op once) before capturing, or pass workspace=",
            "workspace_too_small")
    with _lock:
        buf = _buffers.get(key)
        if buf is not None and buf.numel() >= need:
            return buf
        size = need if buf is None else max(need, 2 * buf.numel())
        new = torch.empty(max(size, 1), dtype=torch.uint8, device=device)
        if buf is not None:
            _retired.append(buf)
        _buffers[key] = new
        return new


def workspace(batch, num_heads, q_len, *, split="auto", num_splits=0, device=None):
    """Allocates (or grows) the workspace that torch.ops.mlakit.decode uses for calls of up to
    `batch` requests with `num_heads` heads and `q_len` query tokens, and returns it.

    Call it before capturing a CUDA graph that contains the op (any call of the op outside
    the capture does the same). `device` defaults to the current CUDA device."""
    _check_range("batch", batch, 0, MAX_BATCH)
    _check_range("num_heads", num_heads, 1, MAX_HEADS)
    _check_range("q_len", q_len, 1, MAX_Q_LEN)
    if split not in SPLIT_MODES:
        raise _domain("split_mode", repr(split), "'auto', 'none' or 'fixed'")
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    if device.type != "cuda":
        raise ArgumentError(f"workspace: device {device} is not a CUDA device")
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    return buffer_for(device, batch, num_heads * q_len, SPLIT_MODES[split], num_splits)


def release_workspaces():
    """Frees every workspace buffer (after a device synchronisation). Only call it when no
    captured CUDA graph that contains the op will be replayed again."""
    with _lock:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
        _buffers.clear()
        _retired.clear()
        _plans.clear()
