"""Paged attention over the KV cache: prefill chunks and decodes in one launch.

Each program owns one request, one KV head and a tile of that request's
queries. The query heads that share the KV head are packed into the tile's
rows (row r is query r // GROUP, head r % GROUP of the group), so a KV tile
is loaded once for the whole group. Keys are walked in tiles of BLOCK_N
positions through the block table, with an online softmax in fp32.

A decode-only batch too small to fill the GPU (at batch 1, one program per KV
head) splits each context into NUM_SPLITS ranges of whole key tiles, one program
each; every program stores its range's normalized output and log-sum-exp, and
a second kernel merges a head's ranges. The split count depends only on the
batch's shape and the longest context it may hold (max_seq_len, a decode graph's
capacity), so a CUDA graph captured with it serves any context length.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

KEY_TILE = 32
MAX_SPLITS = 16
CPU_PROGRAM_TARGET = 128   # the interpreter has no SMs; a GPU-sized figure keeps its split path tested
_TRITON_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@dataclass(frozen=True)
class Launch:
    """The attention kernel's key tile and launch settings (Triton's defaults otherwise)."""
    key_tile: int = KEY_TILE
    num_warps: int = 4
    num_stages: int = 3


# A decode-only batch whose contexts are not split walks them in tiles of 64 keys: at the 8B
# config's shapes on an H200, batch 32 at 192 tokens 12.7 us a layer against 14.8, batch 128
# 35.3 against 37.3, batch 32 at 1000 tokens 39.6 against 54.4 (benchmarks/gpu_small_batch.py).
# ENGINE_DECODE_KEY_TILE=32 gives it the tile of every other batch, to compare.
WHOLE_CONTEXT_DECODE = Launch(key_tile=int(os.environ.get("ENGINE_DECODE_KEY_TILE", "64")))


@triton.jit
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, partial_ptr, lse_ptr,
    block_tables_ptr, query_start_loc_ptr, seq_lens_ptr,
    scale_log2e,
    stride_q_token, stride_q_head,
    stride_out_token, stride_out_head,
    stride_partial_token, stride_partial_head, stride_lse_token, stride_lse_head,
    stride_cache_block, stride_cache_slot, stride_cache_head,
    stride_block_table,
    head_dim,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
):
    request = tl.program_id(0)
    query_tile = tl.program_id(1) // NUM_SPLITS
    split = tl.program_id(1) % NUM_SPLITS
    kv_head = tl.program_id(2)
    queries_per_tile: tl.constexpr = BLOCK_M // GROUP

    query_start = tl.load(query_start_loc_ptr + request)
    query_len = tl.load(query_start_loc_ptr + request + 1) - query_start
    if query_tile * queries_per_tile >= query_len:
        return
    seq_len = tl.load(seq_lens_ptr + request)
    first_query_pos = seq_len - query_len
    # Keys 0..last_pos are visible to some row of this tile; this program takes keys_from..keys_to.
    last_pos = first_query_pos + tl.minimum((query_tile + 1) * queries_per_tile, query_len) - 1
    split_len = _split_len(seq_len, NUM_SPLITS, BLOCK_N)
    keys_from = split * split_len
    if keys_from > last_pos:
        return
    keys_to = tl.minimum(keys_from + split_len, last_pos + 1)

    rows = tl.arange(0, BLOCK_M)
    query_idx = query_tile * queries_per_tile + rows // GROUP
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < queries_per_tile * GROUP) & (query_idx < query_len)
    query_pos = first_query_pos + query_idx
    dims = tl.arange(0, BLOCK_D)
    dim_valid = dims < head_dim

    q_offsets = ((query_start + query_idx).to(tl.int64)[:, None] * stride_q_token
                 + head[:, None] * stride_q_head + dims[None, :])
    q = tl.load(q_ptr + q_offsets, mask=row_valid[:, None] & dim_valid[None, :], other=0.0).to(DOT_DTYPE)

    row_max = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    key_offsets_in_tile = tl.arange(0, BLOCK_N)
    block_table = block_tables_ptr + request.to(tl.int64) * stride_block_table
    for key_tile_start in range(keys_from, keys_to, BLOCK_N):
        key_pos = key_tile_start + key_offsets_in_tile
        key_valid = key_pos < seq_len
        block_id = tl.load(block_table + key_pos // BLOCK_SIZE, mask=key_valid, other=0)
        kv_offsets = (block_id.to(tl.int64)[:, None] * stride_cache_block
                      + (key_pos % BLOCK_SIZE)[:, None] * stride_cache_slot
                      + kv_head * stride_cache_head + dims[None, :])
        kv_mask = key_valid[:, None] & dim_valid[None, :]
        k = tl.load(k_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)
        v = tl.load(v_cache_ptr + kv_offsets, mask=kv_mask, other=0.0).to(DOT_DTYPE)

        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2e
        causal = key_pos[None, :] <= query_pos[:, None]
        scores = tl.where(causal, scores, float("-inf"))

        # The first key of the range is visible to every row (splits are decode-only), so
        # row_max is finite from the first tile on.
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        rescale = tl.exp2(row_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        row_sum = row_sum * rescale + tl.sum(probs, axis=1)
        acc = acc * rescale[:, None] + tl.dot(probs.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        row_max = new_max

    out = acc / row_sum[:, None]
    token = (query_start + query_idx).to(tl.int64)
    store_mask = row_valid[:, None] & dim_valid[None, :]
    if NUM_SPLITS == 1:
        out_offsets = token[:, None] * stride_out_token + head[:, None] * stride_out_head + dims[None, :]
        tl.store(out_ptr + out_offsets, out.to(out_ptr.dtype.element_ty), mask=store_mask)
    else:
        partial_offsets = (token[:, None] * stride_partial_token + head[:, None] * stride_partial_head
                           + split * head_dim + dims[None, :])
        tl.store(partial_ptr + partial_offsets, out, mask=store_mask)
        lse_offsets = token * stride_lse_token + head * stride_lse_head + split
        tl.store(lse_ptr + lse_offsets, row_max + tl.log2(row_sum), mask=row_valid)


@triton.jit
def _split_len(seq_len, NUM_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr):
    """Keys per split: whole tiles, so no tile straddles two splits."""
    return tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N


@triton.jit
def _merge_splits_kernel(
    partial_ptr, lse_ptr, out_ptr, query_start_loc_ptr, seq_lens_ptr,
    stride_partial_token, stride_partial_head, stride_lse_token, stride_lse_head,
    stride_out_token, stride_out_head,
    head_dim,
    NUM_SPLITS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    """One decode query's head: its splits' outputs weighted by their share of the softmax."""
    request = tl.program_id(0)
    head = tl.program_id(1)
    token = tl.load(query_start_loc_ptr + request).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + request)
    live = tl.cdiv(seq_len, _split_len(seq_len, NUM_SPLITS, BLOCK_N))   # the splits that held keys
    splits = tl.arange(0, NUM_SPLITS)
    dims = tl.arange(0, BLOCK_D)
    lse = tl.load(lse_ptr + token * stride_lse_token + head * stride_lse_head + splits,
                  mask=splits < live, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, axis=0))
    partial_offsets = (token * stride_partial_token + head * stride_partial_head
                       + splits[:, None] * head_dim + dims[None, :])
    partial = tl.load(partial_ptr + partial_offsets, mask=(splits < live)[:, None] & (dims < head_dim)[None, :],
                      other=0.0)
    out = tl.sum(partial * weights[:, None], axis=0) / tl.sum(weights, axis=0)
    tl.store(out_ptr + token * stride_out_token + head * stride_out_head + dims,
             out.to(out_ptr.dtype.element_ty), mask=dims < head_dim)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                    meta, scale: float, launch: Launch | None = None) -> torch.Tensor:
    """Causal attention of q [T, H, D] over the paged cache; returns [T, H, D].

    `meta` is an engine.model.attention.AttentionMetadata. The new tokens' keys and
    values must already be in the cache (write_kv first). `launch`: by default Launch(),
    and WHOLE_CONTEXT_DECODE for a decode-only batch that is not split.
    """
    _check_inputs(q, k_cache, v_cache)
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    num_requests = meta.seq_lens.shape[0]
    if num_tokens == 0 or num_requests == 0:
        return out

    rows_needed = 16 if meta.max_query_len * group <= 16 else 64
    block_m = max(rows_needed, triton.next_power_of_2(group))
    queries_per_tile = block_m // group
    # The CPU interpreter cannot multiply bf16 (it holds it as raw uint16 bits), so it gets fp32 tiles.
    dot_dtype = tl.float32 if q.is_cpu else _TRITON_DTYPES[q.dtype]
    splits = decode_splits(num_requests, num_kv_heads, meta.max_query_len, meta.max_seq_len,
                           program_target(q.device), (launch or Launch()).key_tile)
    if launch is None:
        launch = WHOLE_CONTEXT_DECODE if meta.max_query_len == 1 and splits == 1 else Launch()
    partial = lse = out
    if splits > 1:
        partial = torch.empty((num_tokens, num_heads, splits, head_dim), dtype=torch.float32, device=q.device)
        lse = torch.empty((num_tokens, num_heads, splits), dtype=torch.float32, device=q.device)
    grid = (num_requests, triton.cdiv(meta.max_query_len, queries_per_tile) * splits, num_kv_heads)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, partial, lse,
        meta.block_tables, meta.query_start_loc, meta.seq_lens,
        scale * 1.4426950408889634,
        q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        partial.stride(0), partial.stride(1), lse.stride(0), lse.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        meta.block_tables.stride(0),
        head_dim,
        GROUP=group,
        BLOCK_M=block_m,
        BLOCK_N=launch.key_tile,
        BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_SIZE=block_size,
        DOT_DTYPE=dot_dtype,
        DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        NUM_SPLITS=splits,
        num_warps=launch.num_warps,
        num_stages=launch.num_stages,
    )
    if splits > 1:
        _merge_splits_kernel[(num_requests, num_heads)](
            partial, lse, out, meta.query_start_loc, meta.seq_lens,
            partial.stride(0), partial.stride(1), lse.stride(0), lse.stride(1),
            out.stride(0), out.stride(1),
            head_dim,
            NUM_SPLITS=splits,
            BLOCK_N=launch.key_tile,
            BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        )
    return out


def decode_splits(num_requests: int, num_kv_heads: int, max_query_len: int, max_seq_len: int,
                  program_target: int, key_tile: int = KEY_TILE) -> int:
    """How many ranges each context is split into: 1 unless the batch is decode-only and has
    fewer (request, KV head) programs than `program_target`; a power of two, at most
    MAX_SPLITS, and no more than the longest context has key tiles."""
    programs = num_requests * num_kv_heads
    if max_query_len != 1 or programs >= program_target:
        return 1
    wanted = triton.next_power_of_2(triton.cdiv(program_target, programs))
    key_tiles = triton.cdiv(max_seq_len, key_tile)
    return min(wanted, MAX_SPLITS, 1 << (key_tiles.bit_length() - 1))


@functools.cache
def program_target(device: torch.device) -> int:
    """Programs that fill the device: one per SM on a GPU."""
    if device.type != "cuda":
        return CPU_PROGRAM_TARGET
    return torch.cuda.get_device_properties(device).multi_processor_count


def _check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if q.dim() != 3 or k_cache.dim() != 4:
        raise ValueError(
            f"expected q [T, H, D] and cache [blocks, block_size, kv_heads, D], "
            f"got q {tuple(q.shape)} and cache {tuple(k_cache.shape)}")
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim or num_heads % num_kv_heads:
        raise ValueError(
            f"q has {num_heads} heads of {head_dim}, cache has {num_kv_heads} kv heads of "
            f"{k_cache.shape[3]}: head dims must match and heads be a multiple of kv heads")
    if v_cache.shape != k_cache.shape or v_cache.stride() != k_cache.stride():
        raise ValueError("k_cache and v_cache must have the same shape and layout")
    if q.stride(2) != 1 or k_cache.stride(3) != 1:
        raise ValueError("q and the caches must be contiguous in the head dim")
    if q.dtype not in _TRITON_DTYPES:
        raise ValueError(f"q has dtype {q.dtype}; supported: float32, bfloat16, float16")
    if not q.dtype == k_cache.dtype == v_cache.dtype:
        raise ValueError(
            f"q, k_cache and v_cache must share a dtype, got {q.dtype}, {k_cache.dtype}, {v_cache.dtype}")
