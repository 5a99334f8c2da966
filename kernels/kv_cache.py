"""Write the new tokens' keys and values into the paged KV cache.

Each program copies a tile of tokens; a token's kv_heads x head_dim values are
handled as one flat row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_TILE_ELEMENTS = 4096


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_mapping_ptr,
    stride_k_token, stride_k_head,
    stride_v_token, stride_v_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    num_tokens, num_kv_heads, head_dim,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_HD: tl.constexpr,
):
    tokens = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    token_valid = tokens < num_tokens
    slots = tl.load(slot_mapping_ptr + tokens, mask=token_valid, other=0)
    flat = tl.arange(0, BLOCK_HD)
    heads = flat // head_dim
    dims = flat % head_dim
    mask = token_valid[:, None] & (heads < num_kv_heads)[None, :]

    cache_offsets = ((slots // BLOCK_SIZE)[:, None] * stride_cache_block
                     + (slots % BLOCK_SIZE)[:, None] * stride_cache_slot
                     + (heads * stride_cache_head + dims)[None, :])
    tokens = tokens.to(tl.int64)
    k_offsets = tokens[:, None] * stride_k_token + (heads * stride_k_head + dims)[None, :]
    v_offsets = tokens[:, None] * stride_v_token + (heads * stride_v_head + dims)[None, :]
    k = tl.load(k_ptr + k_offsets, mask=mask)
    v = tl.load(v_ptr + v_offsets, mask=mask)
    tl.store(k_cache_ptr + cache_offsets, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + cache_offsets, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store k, v [T, kv_heads, D] at cache slots slot_mapping [T] (block_id * block_size + offset)."""
    _check_inputs(k, v, k_cache, v_cache, slot_mapping)
    num_tokens, num_kv_heads, head_dim = k.shape
    if num_tokens == 0:
        return
    block_hd = triton.next_power_of_2(num_kv_heads * head_dim)
    block_t = min(16, max(1, MAX_TILE_ELEMENTS // block_hd))
    _write_kv_kernel[(triton.cdiv(num_tokens, block_t),)](
        k, v, k_cache, v_cache, slot_mapping,
        k.stride(0), k.stride(1),
        v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        num_tokens, num_kv_heads, head_dim,
        BLOCK_SIZE=k_cache.shape[1],
        BLOCK_T=block_t,
        BLOCK_HD=block_hd,
    )


def _check_inputs(k, v, k_cache, v_cache, slot_mapping) -> None:
    if k.dim() != 3 or k.shape != v.shape or k_cache.dim() != 4:
        raise ValueError(
            f"expected k, v [T, kv_heads, D] and cache [blocks, block_size, kv_heads, D], "
            f"got k {tuple(k.shape)}, v {tuple(v.shape)}, cache {tuple(k_cache.shape)}")
    if k.shape[1:] != k_cache.shape[2:]:
        raise ValueError(f"k has heads x dim {tuple(k.shape[1:])}, cache has {tuple(k_cache.shape[2:])}")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and layout")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({k.shape[0]},)")
    if k.stride(2) != 1 or v.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError("k, v and the caches must be contiguous in the head dim")
