"""A few rows times a weight matrix: y = x W^T for x [M, K], W [N, K] with M of 2 to a few
dozen, the products of a decode step at a small batch; optionally with the SiLU-and-mul
after it folded in.

The weight is read once, as in kernels/gemv.py, but with M rows each weight element
takes M multiply-adds: too many for the CUDA cores, so the product runs on the matrix
units. Operands swapped: each program owns BLOCK_N rows of W and computes
W[BLOCK_N, K] x^T[K, BLOCK_M], the batch (padded to BLOCK_M, at least 16) as the
narrow side; one kernel, no split-K reduce.

With silu_and_mul, W is the merged [gate | up] weight [2N, K]: each program owns BLOCK_N
gate rows and the matching up rows and stores silu(gate) * up, both sums rounded to the
output's dtype first, as silu_and_mul reads them.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

SHARED_MEMORY_FOR_STAGES = 160 * 1024  # of an H100/H200 SM's 227 KiB


@dataclass(frozen=True)
class Tile:
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


# Of 6 tiles tried for each of the 8B's products at batch 8 and 32 on an H200, the fastest
# or within 0.4 us of it (benchmarks/gpu_small_batch.py, docs/performance.md): 64 rows a
# program for the products of at least 6144 rows (qkv, gate/up: 96 and 224 programs),
# 32 for the smaller ones (o, down: 128 programs rather than 64).
WIDE_TILE, NARROW_TILE = Tile(64, 128, 4, 4), Tile(32, 256, 4, 4)
WIDE_TILE_MIN_ROWS = 6144


def default_tile(n_out: int) -> Tile:
    return WIDE_TILE if n_out >= WIDE_TILE_MIN_ROWS else NARROW_TILE


@triton.jit
def _small_batch_kernel(x_ptr, w_ptr, out_ptr, m_rows, n_out, k_size,
                        stride_x_row, stride_w_row, stride_out_row, up_offset,
                        SILU_AND_MUL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, DOT_DTYPE: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)   # of W: the output's columns
    row_ok = rows < n_out
    batch = tl.arange(0, BLOCK_M)
    batch_ok = batch < m_rows
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w_row
    x_cols = x_ptr + batch.to(tl.int64)[None, :] * stride_x_row
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    if SILU_AND_MUL:
        up_acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for start in range(0, k_size, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        if EVEN_K:
            w_mask = row_ok[:, None]
            x_mask = batch_ok[None, :]
        else:
            w_mask = row_ok[:, None] & (cols < k_size)[None, :]
            x_mask = batch_ok[None, :] & (cols < k_size)[:, None]
        x_t = tl.load(x_cols + cols[:, None], mask=x_mask, other=0.0).to(DOT_DTYPE)
        w = tl.load(w_rows + cols[None, :], mask=w_mask, other=0.0).to(DOT_DTYPE)
        acc = tl.dot(w, x_t, acc)
        if SILU_AND_MUL:
            up = tl.load(w_rows + up_offset + cols[None, :], mask=w_mask, other=0.0).to(DOT_DTYPE)
            up_acc = tl.dot(up, x_t, up_acc)
    out = acc
    if SILU_AND_MUL:  # each product rounded to the output's dtype, as silu_and_mul reads it
        gate = acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        up_out = up_acc.to(out_ptr.dtype.element_ty).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up_out
    tl.store(out_ptr + batch.to(tl.int64)[None, :] * stride_out_row + rows[:, None],
             out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None] & batch_ok[None, :])


def small_batch_matmul(x: torch.Tensor, weight: torch.Tensor, silu_and_mul: bool = False,
                       tile: Tile | None = None) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T -> [M, N] in x's dtype, for 16-bit x and weight (the CPU
    interpreter, which cannot multiply bf16, computes in float32). With silu_and_mul,
    weight is [gate | up] along N and the result silu(gate) * up, [M, N/2]."""
    n_rows, k_size = weight.shape
    if x.dim() != 2 or x.shape[1] != k_size:
        raise ValueError(f"small_batch_matmul needs x [M, {k_size}] for a weight of shape "
                         f"{tuple(weight.shape)}, got {tuple(x.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("small_batch_matmul needs x and the weight contiguous along K")
    if silu_and_mul and n_rows % 2:
        raise ValueError(f"small_batch_matmul's silu_and_mul needs an even number of rows, got {n_rows}")
    m_rows = x.shape[0]
    n_out = n_rows // 2 if silu_and_mul else n_rows
    out = torch.empty((m_rows, n_out), dtype=x.dtype, device=x.device)
    if m_rows == 0:
        return out
    tile = tile or default_tile(n_out)
    block_m = max(16, triton.next_power_of_2(m_rows))
    block_k = min(tile.block_k, max(16, triton.next_power_of_2(k_size)))
    # One pipeline stage holds an x tile and one weight tile (two with silu_and_mul).
    stage_bytes = (block_m + tile.block_n * (2 if silu_and_mul else 1)) * block_k * x.element_size()
    _small_batch_kernel[(triton.cdiv(n_out, tile.block_n),)](
        x, weight, out, m_rows, n_out, k_size, x.stride(0), weight.stride(0), out.stride(0),
        n_out * weight.stride(0),
        SILU_AND_MUL=silu_and_mul, BLOCK_M=block_m, BLOCK_N=tile.block_n, BLOCK_K=block_k,
        EVEN_K=k_size % block_k == 0, DOT_DTYPE=tl.float32 if x.is_cpu else tl.bfloat16
        if x.dtype == torch.bfloat16 else tl.float16,
        num_warps=tile.num_warps, num_stages=max(1, min(tile.num_stages, SHARED_MEMORY_FOR_STAGES // stage_bytes)))
    return out
