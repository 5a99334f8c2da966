"""One row times a weight matrix: y = x W^T for x [1, K], W [N, K], the product of a
decode step at batch 1; optionally with the RMSNorm before it and the SiLU-and-mul
after it folded in.

cuBLAS runs it as a skinny GEMM: for the smaller projections of an 8B Llama on an
H200 it reads the weight at 70-75% of the copy bandwidth and adds a split-K reduce
kernel. Here each program owns BLOCK_N whole rows of W and walks them along K, a
[BLOCK_N, BLOCK_K] tile at a time, multiplying by x and keeping the partial sums in
float32 registers; one reduction across the tile at the end, no second kernel.

Folded in, each as its own kernel would compute it (so that it needs no launch):
- the norm, rms_norm(x [+ residual]) of kernels/norm.py: each program first reads the
  whole row for its sum of squares, then normalizes it tile by tile as it goes; program
  0 stores x + residual;
- SiLU-and-mul, for the merged gate/up weight [2N, K]: each program owns BLOCK_N gate
  rows and the matching up rows and stores silu(gate) * up, N values in all.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _summed(x_ptr, residual_ptr, cols, mask, HAS_RESIDUAL: tl.constexpr):
    """x [+ residual] in float32, the sum rounded to x's dtype as the norm kernel rounds it."""
    x = tl.load(x_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(x_ptr.dtype.element_ty).to(tl.float32)
    return x


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, out_ptr, n_out, k_size, stride_w_row, up_offset,
                 residual_ptr, norm_weight_ptr, new_residual_ptr, eps,
                 NORM: tl.constexpr, HAS_RESIDUAL: tl.constexpr, ROW_BLOCK: tl.constexpr,
                 SILU_AND_MUL: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    program = tl.program_id(0)
    rows = program * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < n_out
    w_rows = w_ptr + rows.to(tl.int64)[:, None] * stride_w_row
    if SILU_AND_MUL:
        up_rows = w_rows + up_offset
        up_acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    if NORM:
        whole = tl.arange(0, ROW_BLOCK)
        row = _summed(x_ptr, residual_ptr, whole, whole < k_size, HAS_RESIDUAL)
        inv_rms = tl.rsqrt(tl.sum(row * row, axis=0) / k_size + eps)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for start in range(0, k_size, BLOCK_K):
        cols = start + tl.arange(0, BLOCK_K)
        col_ok = cols < k_size
        if NORM:
            summed = _summed(x_ptr, residual_ptr, cols, col_ok, HAS_RESIDUAL)
            if HAS_RESIDUAL:
                if program == 0:
                    tl.store(new_residual_ptr + cols, summed.to(new_residual_ptr.dtype.element_ty), mask=col_ok)
            norm_weight = tl.load(norm_weight_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
            x = (summed * inv_rms * norm_weight).to(out_ptr.dtype.element_ty)
        elif EVEN_K:
            x = tl.load(x_ptr + cols)
        else:
            x = tl.load(x_ptr + cols, mask=col_ok, other=0.0)
        x = x.to(tl.float32)[None, :]
        if EVEN_K:
            w_mask = row_ok[:, None]
        else:
            w_mask = row_ok[:, None] & col_ok[None, :]
        acc += tl.load(w_rows + cols[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
        if SILU_AND_MUL:
            up_acc += tl.load(up_rows + cols[None, :], mask=w_mask, other=0.0).to(tl.float32) * x
    out = tl.sum(acc, axis=1)
    if SILU_AND_MUL:  # each product rounded to the output's dtype, as silu_and_mul reads it
        gate = out.to(out_ptr.dtype.element_ty).to(tl.float32)
        up = tl.sum(up_acc, axis=1).to(out_ptr.dtype.element_ty).to(tl.float32)
        out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + rows, out.to(out_ptr.dtype.element_ty), mask=row_ok)


def gemv(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None = None, eps: float = 0.0,
         residual: torch.Tensor | None = None, silu_and_mul: bool = False, block_n: int | None = None,
         block_k: int = 512, num_warps: int | None = None, num_stages: int = 4):
    """x [1, K] @ weight[N, K]^T -> [1, N], in x's dtype. The default tile (8 warps where
    rows are longer than 4096, else 4) was within 2% of the fastest of 24 tried for each
    product of the 8B Llama on an H200, within 6% for the 1B's (benchmarks/gpu_gemv.py).

    With norm_weight, the product is of rms_norm(x [+ residual]); with a residual too it
    returns (product, x + residual), as kernels/norm.py's rms_norm does; its default row
    block is 16, as each program reads the whole row once more (8B qkv on an H200: 18.0
    us at 16, 21.1 at 8). With silu_and_mul, weight is [gate | up] along N and the
    result silu(gate) * up, [1, N/2]."""
    n_rows, k_size = weight.shape
    if x.dim() != 2 or x.shape != (1, k_size):
        raise ValueError(f"gemv needs x [1, {k_size}] for a weight of shape {tuple(weight.shape)}, "
                         f"got {tuple(x.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gemv needs x and the weight contiguous along K")
    if (residual is not None and (norm_weight is None or residual.shape != x.shape)) or (
            norm_weight is not None and norm_weight.shape != (k_size,)):
        raise ValueError(f"gemv's norm needs a weight ({k_size},), and a residual only with it, shaped like x")
    if silu_and_mul and n_rows % 2:
        raise ValueError(f"gemv's silu_and_mul needs an even number of rows, got {n_rows}")
    n_out = n_rows // 2 if silu_and_mul else n_rows
    out = torch.empty((1, n_out), dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(x) if residual is not None else None
    block_k = min(block_k, triton.next_power_of_2(k_size))
    block_n = block_n or (16 if norm_weight is not None else 8)
    _gemv_kernel[(triton.cdiv(n_out, block_n),)](
        x, weight, out, n_out, k_size, weight.stride(0), n_out * weight.stride(0),
        x if residual is None else residual, x if norm_weight is None else norm_weight,
        out if new_residual is None else new_residual, eps,
        NORM=norm_weight is not None, HAS_RESIDUAL=residual is not None,
        ROW_BLOCK=triton.next_power_of_2(k_size) if norm_weight is not None else 1,
        SILU_AND_MUL=silu_and_mul, BLOCK_N=block_n, BLOCK_K=block_k, EVEN_K=k_size % block_k == 0,
        num_warps=num_warps or (8 if k_size > 4096 else 4), num_stages=num_stages)
    return out if new_residual is None else (out, new_residual)
