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
