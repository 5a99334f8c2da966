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
from torch import Tensor, nn

from engine.layers import apply_rotary, fused


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
    block_size = k_cache.shape[1]
    group = q.shape[1] // k_cache.shape[2]  # query heads per KV head (GQA)
    query_starts = meta.query_start_loc.tolist()
    out = torch.empty_like(q)
    for b, seq_len in enumerate(meta.seq_lens.tolist()):
        rows = slice(query_starts[b], query_starts[b + 1])
        blocks = meta.block_tables[b, :-(-seq_len // block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)
        v = v_cache[blocks].flatten(0, 1)[:seq_len].repeat_interleave(group, dim=1)
        out[rows] = _causal_attention(q[rows], k, v, scale)
    return out


def _causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """q [Q, heads, d] at the last Q of the S positions of k, v [S, heads, d]."""
    num_queries, seq_len = q.shape[0], k.shape[0]
    scores = torch.einsum("qhd,khd->hqk", q.float(), k.float()) * scale
    query_pos = torch.arange(seq_len - num_queries, seq_len, device=q.device)
    future = torch.arange(seq_len, device=q.device) > query_pos.unsqueeze(1)
    probs = scores.masked_fill_(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v.float()).to(q.dtype)


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
