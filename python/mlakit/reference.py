"""Float32 PyTorch reference of mlakit's decode, on any device.

softmax(softmax_scale * Q K^T) V per request, with K the 576-wide cache rows (times kv_scale;
fp8 caches decoded to float first), V their first 512 values, and the causal mask aligned
bottom-right: query token t of a request with L cached tokens and q_len new ones sees keys
j <= L - q_len + t. LSE is the natural log of the softmax denominator, -inf for a row that
sees no key (its output is 0). kv_len values are clamped like the library clamps them: a
negative value counts as 0, a value past the request's page capacity or past 2^30 is cut to it.

It reads page ids and lengths on the host (.tolist()), so it synchronises: it is for tests and
for checking results, and it is the CPU implementation of torch.ops.mlakit.decode.
merge_states_reference (float64) is the CPU implementation of torch.ops.mlakit.merge_states.
"""
import torch

from ._checks import HEAD_DIM_QK, HEAD_DIM_V

MAX_KV_LEN = 1 << 30  # the library's kMaxKvLen (core/plan.hpp)


def _gather(kv, idx):
    """kv[idx] for any cache dtype (fp8 pages are gathered as bytes: index_select does not
    take every fp8 dtype on every device)."""
    if kv.element_size() == 1:
        return kv.view(torch.uint8).index_select(0, idx).view(kv.dtype)
    return kv.index_select(0, idx)


def decode_reference(q, kv_cache, kv_len, *, block_table=None, kv_indptr=None, kv_indices=None,
                     softmax_scale, kv_scale=1.0, causal=True, kv_rope=None):
    """Returns (out, lse) in float32: out [batch, q_len, heads, 512], lse [batch, q_len, heads].
    With kv_rope ([pages, page_size, 64]) the rotary values come from it and kv_cache holds the
    512 latent values of each row."""
    kv = kv_cache[:, :, 0, :] if kv_cache.dim() == 4 else kv_cache
    if kv_rope is not None:
        rope = kv_rope[:, :, 0, :] if kv_rope.dim() == 4 else kv_rope
        if kv.element_size() == 1:  # torch.cat does not take every fp8 dtype on every device
            kv = torch.cat([kv[..., :HEAD_DIM_V].view(torch.uint8), rope.view(torch.uint8)],
                           -1).view(kv.dtype)
        else:
            kv = torch.cat([kv[..., :HEAD_DIM_V], rope], -1)
    batch, q_len, heads, _ = q.shape
    page_size = kv.shape[1]
    out = torch.zeros(batch, q_len, heads, HEAD_DIM_V, dtype=torch.float32, device=q.device)
    lse = torch.full((batch, q_len, heads), float("-inf"), dtype=torch.float32, device=q.device)
    lens = kv_len.tolist()
    if block_table is not None:
        tables = block_table.tolist()
    else:
        indptr = kv_indptr.tolist()
        indices = kv_indices.tolist()
    for b in range(batch):
        if block_table is not None:
            pages = tables[b]
        else:
            pages = indices[indptr[b]:max(indptr[b], indptr[b + 1])]
        length = min(max(lens[b], 0), len(pages) * page_size, MAX_KV_LEN)
        used = pages[:(length + page_size - 1) // page_size]
        idx = torch.tensor(used, dtype=torch.long, device=kv.device)
        keys = _gather(kv, idx).reshape(-1, HEAD_DIM_QK)[:length].float() * kv_scale
        s = torch.einsum("thd,nd->thn", q[b].float(), keys) * softmax_scale
        if causal:
            t = torch.arange(q_len, device=q.device).view(q_len, 1, 1)
            j = torch.arange(length, device=q.device).view(1, 1, length)
            s = s.masked_fill(j > length - q_len + t, float("-inf"))
        row_lse = torch.logsumexp(s, dim=-1)
        seen = torch.isfinite(row_lse)
        p = torch.exp(s - torch.where(seen, row_lse, torch.zeros_like(row_lse)).unsqueeze(-1))
        p = torch.where(seen.unsqueeze(-1), p, torch.zeros_like(p))
        out[b] = torch.einsum("thn,nd->thd", p, keys[:, :HEAD_DIM_V])
        lse[b] = row_lse
    return out, lse


def merge_states_reference(part_o, part_lse):
    """The merge of N partial results per row, in float64: part_o [N, T, H, D], part_lse
    [N, T, H] (natural log; -inf or +inf for an empty part, whose O is not read). Returns
    (out [T, H, D], lse [T, H]) in float32: out = sum_p exp(lse_p - lse) o_p with
    lse = log sum_p exp(lse_p); a row of empty parts gets out = 0 and lse = -inf."""
    inf = float("inf")
    lse = part_lse.double()
    lse = torch.where(lse == inf, torch.full_like(lse, -inf), lse)
    m = lse.max(dim=0).values
    base = torch.where(m == -inf, torch.zeros_like(m), m)
    w = torch.exp(lse - base)  # 0 for empty parts
    used = (w > 0).unsqueeze(-1)
    o = torch.where(used, part_o.double(), torch.zeros((), dtype=torch.float64, device=part_o.device))
    total = w.sum(dim=0)
    seen = total > 0
    out = (w.unsqueeze(-1) * o).sum(dim=0) / torch.where(seen, total, torch.ones_like(total)).unsqueeze(-1)
    out = torch.where(seen.unsqueeze(-1) | torch.isnan(total).unsqueeze(-1), out, torch.zeros_like(out))
    merged = torch.where(seen | torch.isnan(total), base + torch.log(total), torch.full_like(total, -inf))
    return out.float(), merged.float()
