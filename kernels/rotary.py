"""Rotary position embedding, HF's "rotate half" (neox) layout: dim i pairs with dim i + head_dim/2.

One program per token rotates all its query and key heads by the cos/sin row of its position.
`rotary_write_kv` does the same and stores the rotated keys and the values straight into
the paged KV cache, so a layer's rotary and cache write are one launch.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(x_ptr, out_ptr, token, stride_x_token, stride_x_head, out_base, stride_out_head,
                  num_heads, cos, sin, half_dim, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    heads = tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_HALF)
    mask = (heads < num_heads)[:, None] & (dims < half_dim)[None, :]
    x_offsets = token * stride_x_token + heads[:, None] * stride_x_head + dims[None, :]
    x1 = tl.load(x_ptr + x_offsets, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_ptr + x_offsets + half_dim, mask=mask, other=0.0).to(tl.float32)
    out_offsets = out_base + heads[:, None] * stride_out_head + dims[None, :]
    out_dtype = out_ptr.dtype.element_ty
    tl.store(out_ptr + out_offsets, (x1 * cos - x2 * sin).to(out_dtype), mask=mask)
    tl.store(out_ptr + out_offsets + half_dim, (x2 * cos + x1 * sin).to(out_dtype), mask=mask)


@triton.jit
def _cos_sin(positions_ptr, cos_sin_cache_ptr, token, stride_cache_pos, half_dim, BLOCK_HALF: tl.constexpr):
    position = tl.load(positions_ptr + token)
    dims = tl.arange(0, BLOCK_HALF)
    cache_row = cos_sin_cache_ptr + position * stride_cache_pos
    cos = tl.load(cache_row + dims, mask=dims < half_dim, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(cache_row + half_dim + dims, mask=dims < half_dim, other=0.0).to(tl.float32)[None, :]
    return cos, sin


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, q_out_ptr, k_out_ptr, positions_ptr, cos_sin_cache_ptr,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head, stride_cache_pos,
    num_heads, num_kv_heads, half_dim,
    BLOCK_H: tl.constexpr, BLOCK_KV_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(positions_ptr, cos_sin_cache_ptr, token, stride_cache_pos, half_dim, BLOCK_HALF)
    head_dim = 2 * half_dim
    _rotate_heads(q_ptr, q_out_ptr, token, stride_q_token, stride_q_head, token * num_heads * head_dim,
                  head_dim, num_heads, cos, sin, half_dim, BLOCK_H, BLOCK_HALF)
    _rotate_heads(k_ptr, k_out_ptr, token, stride_k_token, stride_k_head, token * num_kv_heads * head_dim,
                  head_dim, num_kv_heads, cos, sin, half_dim, BLOCK_KV_H, BLOCK_HALF)


@triton.jit
def _rotary_write_kv_kernel(
    q_ptr, k_ptr, v_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
    positions_ptr, cos_sin_cache_ptr, slot_mapping_ptr,
    stride_q_token, stride_q_head, stride_k_token, stride_k_head, stride_v_token, stride_v_head,
    stride_cache_pos, stride_cache_block, stride_cache_slot, stride_cache_head,
    num_heads, num_kv_heads, half_dim,
    BLOCK_SIZE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_KV_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    cos, sin = _cos_sin(positions_ptr, cos_sin_cache_ptr, token, stride_cache_pos, half_dim, BLOCK_HALF)
    head_dim = 2 * half_dim
    _rotate_heads(q_ptr, q_out_ptr, token, stride_q_token, stride_q_head, token * num_heads * head_dim,
                  head_dim, num_heads, cos, sin, half_dim, BLOCK_H, BLOCK_HALF)
    slot = tl.load(slot_mapping_ptr + token)
    cache_base = (slot // BLOCK_SIZE) * stride_cache_block + (slot % BLOCK_SIZE) * stride_cache_slot
    _rotate_heads(k_ptr, k_cache_ptr, token, stride_k_token, stride_k_head, cache_base,
                  stride_cache_head, num_kv_heads, cos, sin, half_dim, BLOCK_KV_H, BLOCK_HALF)
    heads = tl.arange(0, BLOCK_KV_H)
    dims = tl.arange(0, 2 * BLOCK_HALF)
    mask = (heads < num_kv_heads)[:, None] & (dims < head_dim)[None, :]
    v = tl.load(v_ptr + token * stride_v_token + heads[:, None] * stride_v_head + dims[None, :], mask=mask)
    tl.store(v_cache_ptr + cache_base + heads[:, None] * stride_cache_head + dims[None, :],
             v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, heads, head_dim] and k [T, kv_heads, head_dim] by positions [T];
    cos_sin_cache [max_positions, head_dim] holds each position's cos, then its sin."""
    _check_inputs(q, k, positions, cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if num_tokens > 0:
        _rotary_kernel[(num_tokens,)](
            q, k, q_out, k_out, positions, cos_sin_cache,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
            num_heads, k.shape[1], head_dim // 2,
            **_blocks(num_heads, k.shape[1], head_dim),
        )
    return q_out, k_out


def rotary_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    slot_mapping: torch.Tensor) -> torch.Tensor:
    """apply_rotary, then the rotated k and v [T, kv_heads, head_dim] stored at their cache
    slots (block_id * block_size + offset), in one launch; returns the rotated q."""
    _check_inputs(q, k, positions, cos_sin_cache)
    num_tokens, num_heads, head_dim = q.shape
    if v.shape != k.shape or v.stride(2) != 1 or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"rotary_write_kv got k {tuple(k.shape)}, v {tuple(v.shape)} and cache "
                         f"{tuple(k_cache.shape)}: k and v must be [T, kv_heads, D] like the cache's rows")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride() or k_cache.stride(3) != 1:
        raise ValueError("k_cache and v_cache must have the same shape and layout, contiguous in the head dim")
    if slot_mapping.shape != (num_tokens,):
        raise ValueError(f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected ({num_tokens},)")
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    if num_tokens > 0:
        _rotary_write_kv_kernel[(num_tokens,)](
            q, k, v, q_out, k_cache, v_cache, positions, cos_sin_cache, slot_mapping,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
            cos_sin_cache.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
            num_heads, k.shape[1], head_dim // 2,
            BLOCK_SIZE=k_cache.shape[1],
            **_blocks(num_heads, k.shape[1], head_dim),
        )
    return q_out


def _blocks(num_heads: int, num_kv_heads: int, head_dim: int) -> dict:
    return {"BLOCK_H": triton.next_power_of_2(num_heads), "BLOCK_KV_H": triton.next_power_of_2(num_kv_heads),
            "BLOCK_HALF": triton.next_power_of_2(head_dim // 2)}


def _check_inputs(q, k, positions, cos_sin_cache) -> None:
    num_tokens, _, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim or head_dim % 2:
        raise ValueError(f"apply_rotary needs q [T, H, D] and k [T, KVH, D] with an even D, "
                         f"got {tuple(q.shape)} and {tuple(k.shape)}")
    if cos_sin_cache.shape[1] != head_dim or positions.shape != (num_tokens,):
        raise ValueError(f"apply_rotary got cos_sin_cache {tuple(cos_sin_cache.shape)} and positions "
                         f"{tuple(positions.shape)} for {num_tokens} tokens of head_dim {head_dim}")
    if q.stride(2) != 1 or k.stride(2) != 1 or cos_sin_cache.stride(1) != 1:
        raise ValueError("apply_rotary needs q, k and cos_sin_cache contiguous in the last dim")
