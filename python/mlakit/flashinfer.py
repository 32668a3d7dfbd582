"""FlashInfer's MLA decode wrapper on top of torch.ops.mlakit.decode, for engines that drive
`BatchMLAPagedAttentionWrapper` (SGLang's and vLLM's FlashInfer MLA backends):

    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper

Same constructor, plan() and run() arguments (run's fp8 keywords ckv_scale, kpe_scale and
ckv_scale_arr included, keyword-only as FlashInfer has them). As in FlashInfer, the batch size
is kv_len_arr's length: longer qo_indptr / kv_indptr arrays (and graph buffers) are sliced.
What differs:
- the cache: ckv_cache and kpe_cache are read in place, as two separate tensors (FlashInfer's
  own layout) or as the two parts of one [pages, page_size, 576] tensor (kv[..., :512] and
  kv[..., 512:], as SGLang's and vLLM's MLA pools hand them over; mlakit's fastest form: one
  source address per token). A cache with no pages (no request has keys) is accepted;
- every request has the same number of query tokens (q_len = total tokens / batch, 1..32);
  a host (CPU) qo_indptr is checked for that in plan(), a device one is not read;
- the float workspace buffer is not used (mlakit keeps its own graph-safe workspace);
- head_dim_ckv 512 and head_dim_kpe 64 only; per-group fp8 scales (ckv_scale_arr) and
  o_scale are not supported;
- plan() takes one keyword FlashInfer does not have: compute="fp8_matrix" selects the library's
  opt-in fp8 matrix mode for a float8_e4m3fn cache (mlakit.decode's `compute`; "standard" by
  default), for every run() of that plan.
run() launches the kernels torch.ops.mlakit.decode launches for the call, writing out and lse
in place through strides, and nothing else when q_nope and q_pe are the two parts of one
tensor (else they are joined by a copy) and ckv_scale equals kpe_scale (else q_pe is scaled
into that copy); the kernels write lse in base 2 (FlashInfer's default,
return_lse_base_on_e=False) or as the natural log. Nothing is read back to the host in run(), so it
captures in a CUDA graph. With use_cuda_graph=True, plan() copies the page ids and lengths into
the buffers given to the constructor, so a captured graph keeps reading the same addresses.
"""
import math

import torch

from . import _ext, _workspace, join_latent_cache, join_q
from ._checks import COMPUTES, HEAD_DIM_QK, HEAD_DIM_V, KV_DTYPES, ArgumentError, _domain

__all__ = ["BatchMLAPagedAttentionWrapper"]

_KPE = HEAD_DIM_QK - HEAD_DIM_V
_FP8 = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def _cache_parts(ckv_cache, kpe_cache, page_size):
    """(kv_cache, kv_rope) for decode(): the 576-wide view when ckv_cache and kpe_cache are the
    two parts of one cache row (the joined form, kv_rope None), else the two tensors as they
    are (the kernels read each in place). Never a copy. A cache without pages is accepted
    whatever its two parts' storage (nothing is read from it)."""
    if ckv_cache.shape[-1] != HEAD_DIM_V or kpe_cache.shape[-1] != _KPE:
        raise ArgumentError(f"ckv_cache {list(ckv_cache.shape)} and kpe_cache {list(kpe_cache.shape)}: "
                            f"expected last dimensions {HEAD_DIM_V} and {_KPE} (head_dim_ckv, head_dim_kpe)")
    if ckv_cache.numel() == 0 and kpe_cache.numel() == 0:
        return ckv_cache.new_empty((0, max(int(page_size), 1), HEAD_DIM_QK)), None
    try:
        return join_latent_cache(ckv_cache, kpe_cache), None
    except ArgumentError:
        return ckv_cache, kpe_cache


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer=None, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        self._use_cuda_graph = use_cuda_graph
        ws = float_workspace_buffer
        self._device = ws.device if isinstance(ws, torch.Tensor) and ws.device.type == "cuda" else None
        self._buffers = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len_arr)
        if use_cuda_graph and any(v is None for k, v in self._buffers.items() if k != "qo_indptr"):
            raise ArgumentError("use_cuda_graph=True needs the kv_indptr, kv_indices and kv_len_arr buffers")
        self._plan = None

    def _device_tensor(self, name, t, device, n):
        """The first n entries of `t` as int32 on `device`; with use_cuda_graph, copied into the
        constructor's buffer (the same addresses at every plan())."""
        t = t[:n].to(device=device, dtype=torch.int32, non_blocking=True)
        buf = self._buffers.get(name)
        if not self._use_cuda_graph or buf is None:
            return t
        if n > buf.shape[0]:
            raise ArgumentError(f"{name} has {n} entries, its CUDA graph buffer {buf.shape[0]}")
        buf[:n].copy_(t, non_blocking=True)
        return buf[:n]

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
             page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False, *,
             compute="standard"):
        if head_dim_ckv != HEAD_DIM_V or head_dim_kpe != _KPE:
            raise ArgumentError(f"head_dim_ckv = {head_dim_ckv}, head_dim_kpe = {head_dim_kpe}: not in the "
                                f"supported domain ({HEAD_DIM_V} and {_KPE}: mlakit attends over 576-wide rows "
                                f"of {HEAD_DIM_V} latent and {_KPE} rotary values)")
        if kv_data_type not in KV_DTYPES:
            raise ArgumentError(f"kv_data_type = {kv_data_type}: not in the supported domain "
                                "(torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e4m3fnuz)")
        if not isinstance(compute, str) or compute not in COMPUTES:
            raise _domain("compute", repr(compute), "'standard' or 'fp8_matrix'")
        if compute == "fp8_matrix" and kv_data_type != torch.float8_e4m3fn:
            raise _domain("compute", repr(compute), f"a torch.float8_e4m3fn cache (kv_data_type is {kv_data_type}); "
                          "'standard' serves every cache")
        # FlashInfer's batch size: the number of lengths; longer index arrays are sliced.
        batch = kv_len_arr.shape[0]
        for name, t in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr)):
            if t.shape[0] < batch + 1:
                raise ArgumentError(f"{name} has {t.shape[0]} entries: at least batch + 1 = {batch + 1} expected "
                                    f"(batch {batch}, the length of kv_len_arr)")
        if not qo_indptr.is_cuda and batch > 0:
            steps = torch.diff(qo_indptr[:batch + 1].to(torch.int64))
            if not torch.all(steps == steps[0]):
                raise ArgumentError("qo_indptr: every request must have the same number of query tokens "
                                    f"(got {steps.tolist()})")
        # FlashInfer's device is its workspace's; without one, that of the page ids.
        device = self._device if self._device is not None else kv_indices.device
        self._plan = dict(
            batch=batch, num_heads=num_heads, page_size=page_size, causal=bool(causal),
            sm_scale=float(sm_scale), q_data_type=q_data_type, kv_data_type=kv_data_type, compute=compute,
            kv_indptr=self._device_tensor("kv_indptr", kv_indptr, device, batch + 1),
            kv_indices=self._device_tensor("kv_indices", kv_indices, device, kv_indices.shape[0]),
            kv_len=self._device_tensor("kv_len", kv_len_arr, device, batch),
            ran=False,  # a run() since this plan(): later runs may reuse mlakit's plan
        )

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False, o_scale=None, *,
            ckv_scale=None, ckv_scale_arr=None, kpe_scale=None):
        from . import decode
        p = self._plan
        if p is None:
            raise ArgumentError("run() before plan()")
        if o_scale is not None:
            raise ArgumentError("o_scale: fp8 outputs are not supported (out has q's dtype)")
        for name, t, want in (("q_nope", q_nope, "q_data_type"), ("q_pe", q_pe, "q_data_type"),
                              ("ckv_cache", ckv_cache, "kv_data_type"), ("kpe_cache", kpe_cache, "kv_data_type")):
            if t.dtype != p[want]:
                raise ArgumentError(f"{name}.dtype={t.dtype} does not match the planned {want}={p[want]}")
        kv_scale, rope_factor = self._scales(ckv_cache, ckv_scale, ckv_scale_arr, kpe_scale)

        total, heads = q_nope.shape[0], q_nope.shape[1]
        batch = p["batch"]
        want_lse = return_lse or lse is not None
        if out is None:
            out = q_nope.new_empty((total, heads, HEAD_DIM_V))
        elif tuple(out.shape) != (total, heads, HEAD_DIM_V) or out.dtype != q_nope.dtype:
            raise ArgumentError(f"out has shape {list(out.shape)} and dtype {out.dtype}: expected "
                                f"{[total, heads, HEAD_DIM_V]} and {q_nope.dtype}")
        if want_lse:
            if lse is None:
                lse = torch.empty((total, heads), dtype=torch.float32, device=q_nope.device)
            elif tuple(lse.shape) != (total, heads) or lse.dtype != torch.float32:
                raise ArgumentError(f"lse has shape {list(lse.shape)} and dtype {lse.dtype}: expected "
                                    f"{[total, heads]} and torch.float32")
        if batch == 0:
            if total != 0:
                raise ArgumentError(f"{total} query tokens for 0 requests")
            return (out, lse) if return_lse else out
        if total % batch != 0:
            raise ArgumentError(f"{total} query tokens for {batch} requests: every request must have the same "
                                "number of query tokens")
        q_len = total // batch
        if rope_factor == 1.0:
            q = join_q(q_nope, q_pe)
        else:  # one scale for the whole row: the rotary part's own scale moves into Q (a copy)
            q = torch.cat([q_nope, q_pe * rope_factor], dim=-1)
        kv, kv_rope = _cache_parts(ckv_cache, kpe_cache, p["page_size"])
        kv_indices = p["kv_indices"]
        if kv.shape[0] == 0:
            # No page to read: CSR ids without a kv_indices array (null), which the library
            # accepts with an empty (null) cache.
            kv_indices = kv_indices.new_empty((0,))
        q4 = q.view(batch, q_len, heads, HEAD_DIM_QK)
        lens = p["kv_len"] if kv_len is None else kv_len
        # The first run() after plan() plans; later runs (the other layers) reuse mlakit's plan
        # where the workspace holds it for the same shape, lengths and kv_indptr.
        workspace, step = None, "plan_and_decode"
        if q4.is_cuda and _ext._C is not None:
            workspace = _workspace.buffer_for(q4.device, batch, q_len * heads, 0, 0)
            key = _workspace.plan_key(q4, kv, None, p["kv_indptr"], lens, p["causal"] or q_len == 1, 0, 0,
                                      kv_rope, p["compute"])
            step = _workspace.step_for(workspace, key, p["ran"])
        p["ran"] = True
        decode(q4, kv, lens, kv_indptr=p["kv_indptr"], kv_indices=kv_indices, softmax_scale=p["sm_scale"],
               kv_scale=kv_scale, causal=p["causal"], out=out.view(batch, q_len, heads, HEAD_DIM_V),
               lse=None if lse is None else lse.view(batch, q_len, heads),
               lse_format="natural" if return_lse_base_on_e else "base2",  # FlashInfer: log2
               kv_rope=kv_rope, workspace=workspace, plan_step=step, compute=p["compute"])
        return (out, lse) if return_lse else out

    def _scales(self, ckv_cache, ckv_scale, ckv_scale_arr, kpe_scale):
        """(kv_scale, factor on q_pe) from FlashInfer's fp8 keywords, with its rules: for an fp8
        cache exactly one of ckv_scale and ckv_scale_arr, and kpe_scale; for 16-bit caches none."""
        if self._plan["kv_data_type"] not in _FP8:
            if ckv_scale is not None or ckv_scale_arr is not None or kpe_scale is not None:
                raise ArgumentError("ckv_scale / ckv_scale_arr / kpe_scale are only valid when kv_data_type is "
                                    "FP8")
            return 1.0, 1.0
        if (ckv_scale is None) == (ckv_scale_arr is None):
            raise ArgumentError("Exactly one of ckv_scale or ckv_scale_arr is required when kv_data_type is FP8")
        if ckv_scale_arr is not None:
            shape = tuple(ckv_cache.shape[:-1]) + (HEAD_DIM_V // 128,)
            if tuple(ckv_scale_arr.shape) != shape:
                raise ArgumentError(f"Invalid shape of ckv_scale_arr: expected {list(shape)}, got "
                                    f"{list(ckv_scale_arr.shape)}")
            raise ArgumentError("ckv_scale_arr: per-group fp8 scales are not supported (mlakit applies one "
                                "kv_scale to the cache: pass ckv_scale)")
        if kpe_scale is None:
            raise ArgumentError("kpe_scale is required when kv_data_type is FP8")
        for name, v in (("ckv_scale", ckv_scale), ("kpe_scale", kpe_scale)):
            if isinstance(v, torch.Tensor) or not math.isfinite(float(v)) or not float(v) > 0:
                raise ArgumentError(f"{name} = {v!r}: not in the supported domain (a finite float > 0)")
        ckv, kpe = float(ckv_scale), float(kpe_scale)
        return ckv, (1.0 if kpe == ckv else kpe / ckv)
