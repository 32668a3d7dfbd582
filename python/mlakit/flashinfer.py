"""FlashInfer's MLA decode wrapper on top of torch.ops.mlakit.decode, for engines that drive
`BatchMLAPagedAttentionWrapper` (SGLang's and vLLM's FlashInfer MLA backends):

    from mlakit.flashinfer import BatchMLAPagedAttentionWrapper

Same constructor, plan() and run() arguments. What differs:
- the cache: mlakit reads 576-wide rows, so ckv_cache and kpe_cache must be the two parts of
  one cache tensor (kv[..., :512] and kv[..., 512:], which is how SGLang's and vLLM's MLA
  pools hand them over); two separate buffers raise ArgumentError;
- every request has the same number of query tokens (q_len = total tokens / batch, 1..32);
  a host (CPU) qo_indptr is checked for that in plan(), a device one is not read;
- the float workspace buffer is not used (mlakit keeps its own graph-safe workspace);
- LSE is returned in base 2, like FlashInfer's, or natural log with return_lse_base_on_e.
With use_cuda_graph=True, plan() copies the page ids and lengths into the buffers given to
the constructor, so a captured graph keeps reading the same addresses.
"""
import math

import torch

from . import join_latent_cache, join_q
from ._checks import HEAD_DIM_QK, HEAD_DIM_V, ArgumentError

__all__ = ["BatchMLAPagedAttentionWrapper"]


class BatchMLAPagedAttentionWrapper:
    def __init__(self, float_workspace_buffer=None, use_cuda_graph=False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend="auto"):
        self._use_cuda_graph = use_cuda_graph
        self._buffers = dict(qo_indptr=qo_indptr, kv_indptr=kv_indptr, kv_indices=kv_indices, kv_len=kv_len_arr)
        if use_cuda_graph and any(v is None for k, v in self._buffers.items() if k != "qo_indptr"):
            raise ArgumentError("use_cuda_graph=True needs the kv_indptr, kv_indices and kv_len_arr buffers")
        self._plan = None

    def _device_tensor(self, name, t, device):
        t = t.to(device=device, dtype=torch.int32, non_blocking=True)
        buf = self._buffers.get(name)
        if not self._use_cuda_graph or buf is None:
            return t
        if t.shape[0] > buf.shape[0]:
            raise ArgumentError(f"{name} has {t.shape[0]} entries, its CUDA graph buffer {buf.shape[0]}")
        buf[:t.shape[0]].copy_(t, non_blocking=True)
        return buf[:t.shape[0]]

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv, head_dim_kpe,
             page_size, causal, sm_scale, q_data_type, kv_data_type, use_profiler=False):
        if head_dim_ckv != HEAD_DIM_V or head_dim_kpe != HEAD_DIM_QK - HEAD_DIM_V:
            raise ArgumentError(f"head_dim_ckv = {head_dim_ckv}, head_dim_kpe = {head_dim_kpe}: "
                                "not in the supported domain (512 and 64)")
        batch = kv_indptr.shape[0] - 1
        if qo_indptr.shape[0] != batch + 1:
            raise ArgumentError(f"qo_indptr has {qo_indptr.shape[0]} entries, kv_indptr {kv_indptr.shape[0]}")
        if not qo_indptr.is_cuda and batch > 0:
            steps = torch.diff(qo_indptr.to(torch.int64))
            if not torch.all(steps == steps[0]):
                raise ArgumentError("qo_indptr: every request must have the same number of query tokens "
                                    f"(got {steps.tolist()})")
        device = kv_indices.device  # the device of the page ids is the device of the cache
        self._plan = dict(
            batch=batch, num_heads=num_heads, page_size=page_size, causal=bool(causal),
            sm_scale=float(sm_scale), q_data_type=q_data_type, kv_data_type=kv_data_type,
            kv_indptr=self._device_tensor("kv_indptr", kv_indptr, device),
            kv_indices=self._device_tensor("kv_indices", kv_indices, device),
            kv_len=self._device_tensor("kv_len", kv_len_arr, device),
        )

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse=False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e=False):
        from . import decode
        p = self._plan
        if p is None:
            raise ArgumentError("run() before plan()")
        total, heads = q_nope.shape[0], q_nope.shape[1]
        batch = p["batch"]
        if batch == 0 or total % batch != 0:
            raise ArgumentError(f"{total} query tokens for {batch} requests: every request must have the same "
                                "number of query tokens")
        q_len = total // batch
        q = join_q(q_nope, q_pe).view(batch, q_len, heads, HEAD_DIM_QK)
        kv = join_latent_cache(ckv_cache, kpe_cache)
        o = None if out is None else out.view(batch, q_len, heads, HEAD_DIM_V)
        want_lse = return_lse or lse is not None
        l = torch.empty(batch, q_len, heads, dtype=torch.float32, device=q.device) if want_lse else None
        res = decode(q, kv, p["kv_len"] if kv_len is None else kv_len, kv_indptr=p["kv_indptr"],
                     kv_indices=p["kv_indices"], softmax_scale=p["sm_scale"], causal=p["causal"], out=o, lse=l)
        o, l = res if want_lse else (res, None)
        o = o.view(total, heads, HEAD_DIM_V)
        if out is not None:
            o = out
        if not want_lse:
            return o
        l = l.view(total, heads)
        if not return_lse_base_on_e:
            l = l * (1.0 / math.log(2.0))
        if lse is not None:
            lse.copy_(l)
            l = lse
        return o, l
