"""Attention over the paged KV cache.

A layer's cache is a pair k_cache, v_cache of [num_blocks, block_size,
num_kv_heads, head_dim]; slot s is row s of the cache seen as
[num_blocks * block_size, num_kv_heads, head_dim]. write_kv, rotary_write_kv and
paged_attention send CUDA tensors to their Triton kernels (kernels/, imported on
first use) and compute CPU tensors with the torch reference here.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from engine.model.kernel_flags import fused
from engine.model.rotary_embedding import apply_rotary


@dataclass
class AttentionMetadata:
    slot_mapping: Tensor      # int64 [T]: cache slot (block_id * block_size + offset) of each new token
    query_start_loc: Tensor   # int32 [B+1]: request b's queries are rows qsl[b]:qsl[b+1]
    seq_lens: Tensor          # int32 [B]: context length of request b after this step
    block_tables: Tensor      # int32 [B, max_blocks]: padded with 0
    max_query_len: int
    max_seq_len: int


def write_kv(k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> None:
    """Store the new tokens' keys and values [T, kv_heads, head_dim] in their slots."""
    if k.is_cuda:
        from kernels.kv_cache import write_kv as write_kv_kernel
        write_kv_kernel(k, v, k_cache, v_cache, slot_mapping)
        return
    k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slot_mapping, k)
    v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slot_mapping, v)


def rotary_write_kv(q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos_sin_cache: Tensor,
                    k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor) -> Tensor:
    """Rotate q and k by their positions, store the rotated k and v in their slots; returns q."""
    if fused(q):
        from kernels.rotary import rotary_write_kv as rotary_write_kv_kernel
        return rotary_write_kv_kernel(q, k, v, positions, cos_sin_cache, k_cache, v_cache, slot_mapping)
    q, k = apply_rotary(q, k, positions, cos_sin_cache)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q


def paged_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, meta: AttentionMetadata,
                    scale: float) -> Tensor:
    """q [T, heads, head_dim] -> [T, heads, head_dim]. Each request's queries are its last
    tokens; they see the request's cached prefix and, causally, each other."""
    if q.is_cuda:
        from kernels.attention import paged_attention as paged_attention_kernel
        return paged_attention_kernel(q, k_cache, v_cache, meta, scale)
    if meta.max_query_len == 1:
        return _decode_attention(q, k_cache, v_cache, meta.block_tables, meta.seq_lens, scale)
    query_starts = meta.query_start_loc.tolist()
    seq_lens = meta.seq_lens.tolist()
    query_lens = [end - start for start, end in zip(query_starts, query_starts[1:])]
    decodes = [b for b, n in enumerate(query_lens) if n == 1]
    out = torch.empty_like(q)
    if decodes:
        rows = torch.tensor([query_starts[b] for b in decodes])
        index = torch.tensor(decodes)
        out[rows] = _decode_attention(q[rows], k_cache, v_cache, meta.block_tables[index],
                                      meta.seq_lens[index], scale)
    for b in (b for b, n in enumerate(query_lens) if n > 1):
        rows = slice(query_starts[b], query_starts[b + 1])
        out[rows] = _chunk_attention(q[rows], k_cache, v_cache, meta.block_tables[b], seq_lens[b], scale)
    return out


def _gather(cache: Tensor, block_tables: Tensor, num_blocks: int) -> Tensor:
    """The first num_blocks blocks of each table, [B, num_blocks * block_size, kv_heads, d]."""
    rows = cache.index_select(0, block_tables[:, :num_blocks].flatten())
    return rows.view(block_tables.shape[0], -1, *cache.shape[2:])


def _decode_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_tables: Tensor,
                      seq_lens: Tensor, scale: float) -> Tensor:
    """One query per request, at its last position: [B, heads, d]. Every request's context
    is gathered to the longest one's length; the slots past its own are masked and
    zeroed, since what they hold (never written, or another request's) must not reach
    the output, not even as 0 * NaN."""
    num_blocks = -(-int(seq_lens.max()) // k_cache.shape[1])
    k = _gather(k_cache, block_tables, num_blocks)                   # [B, S, kv_heads, d]
    v = _gather(v_cache, block_tables, num_blocks)
    visible = torch.arange(k.shape[1]) < seq_lens[:, None]
    past_end = (~visible).flatten().nonzero().squeeze(1)
    for gathered in (k, v):
        gathered.view(-1, *gathered.shape[2:]).index_fill_(0, past_end, 0)
    out = F.scaled_dot_product_attention(q.unsqueeze(2), k.transpose(1, 2), v.transpose(1, 2),
                                         attn_mask=visible[:, None, None, :], scale=scale,
                                         enable_gqa=True)
    return out.squeeze(2)


def _chunk_attention(q: Tensor, k_cache: Tensor, v_cache: Tensor, block_table: Tensor,
                     seq_len: int, scale: float) -> Tensor:
    """One request's Q queries [Q, heads, d] at the last Q of its seq_len positions."""
    num_queries = q.shape[0]
    num_blocks = -(-seq_len // k_cache.shape[1])
    k = _gather(k_cache, block_table[None], num_blocks)[0, :seq_len].transpose(0, 1)
    v = _gather(v_cache, block_table[None], num_blocks)[0, :seq_len].transpose(0, 1)
    query_pos = torch.arange(seq_len - num_queries, seq_len)
    visible = torch.arange(seq_len) <= query_pos[:, None]
    # With a batch dim of 1: on 3-d inputs SDPA takes a path 3-4x slower on the CPU.
    out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k[None], v[None], attn_mask=visible,
                                         scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


class Attention(nn.Module):
    """One layer's attention: rotate q and k, store this step's k, v in the layer's cache,
    attend over it."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.scale = head_dim ** -0.5

    def forward(self, positions: Tensor, q: Tensor, k: Tensor, v: Tensor, cos_sin_cache: Tensor,
                kv_cache: tuple[Tensor, Tensor], meta: AttentionMetadata) -> Tensor:
        """q [T, heads, d], k and v [T, kv_heads, d] -> [T, heads * d]."""
        k_cache, v_cache = kv_cache
        q = rotary_write_kv(q, k, v, positions, cos_sin_cache, k_cache, v_cache, meta.slot_mapping)
        return paged_attention(q, k_cache, v_cache, meta, self.scale).flatten(1)
