"""SwiGLU's gate: silu(x[..., :d]) * x[..., d:]; and the gate/up product with it as its epilogue."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

COLUMN_TILE = 1024
SHARED_MEMORY_FOR_STAGES = 160 * 1024  # of an H100/H200 SM's 227 KiB, the rest left to the epilogue
_DOT_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _silu_and_mul_kernel(x_ptr, out_ptr, stride_x_row, half_width, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < half_width
    gate = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x_row + half_width + cols, mask=mask, other=0.0).to(tl.float32)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row * half_width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [..., 2d] -> [..., d]."""
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"silu_and_mul needs an even last dim, got {width}")
    rows = x.reshape(-1, width)
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    half_width = width // 2
    out = torch.empty((*x.shape[:-1], half_width), dtype=x.dtype, device=x.device)
    if rows.shape[0] > 0:
        block = min(COLUMN_TILE, triton.next_power_of_2(half_width))
        grid = (rows.shape[0], triton.cdiv(half_width, block))
        _silu_and_mul_kernel[grid](rows, out, rows.stride(0), half_width, BLOCK=block)
    return out


@triton.jit
def _gate_up_silu_kernel(
    x_ptr, w_ptr, out_ptr,
    rows, width, hidden_size,
    stride_x_row, stride_w_row, stride_out_row,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    row = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    col = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_valid, col_valid = row < rows, col < width
    gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    gate_rows = w_ptr + col.to(tl.int64)[None, :] * stride_w_row
    up_rows = gate_rows + width * stride_w_row
    for k_start in range(0, hidden_size, BLOCK_K):
        k = k_start + tl.arange(0, BLOCK_K)
        k_valid = k < hidden_size
        x = tl.load(x_ptr + row.to(tl.int64)[:, None] * stride_x_row + k[None, :],
                    mask=row_valid[:, None] & k_valid[None, :], other=0.0).to(DOT_DTYPE)
        w_mask = k_valid[:, None] & col_valid[None, :]
        w_gate = tl.load(gate_rows + k[:, None], mask=w_mask, other=0.0).to(DOT_DTYPE)
        w_up = tl.load(up_rows + k[:, None], mask=w_mask, other=0.0).to(DOT_DTYPE)
        gate = tl.dot(x, w_gate, gate, input_precision=DOT_PRECISION)
        up = tl.dot(x, w_up, up, input_precision=DOT_PRECISION)
    out = gate * tl.sigmoid(gate) * up
    tl.store(out_ptr + row.to(tl.int64)[:, None] * stride_out_row + col[None, :],
             out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None] & col_valid[None, :])


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor, block_n: int = 64, block_k: int = 128) -> torch.Tensor:
    """silu_and_mul(x @ weight.T) in one kernel, for x [T, hidden] and the merged gate/up
    weight [2d, hidden]: the activation is the product's epilogue. Measured against the
    two-kernel path by benchmarks/gpu_decode.py; the engine does not use it."""
    rows, hidden_size = x.shape
    if weight.dim() != 2 or weight.shape[1] != hidden_size or weight.shape[0] % 2:
        raise ValueError(f"gate_up_silu needs x [T, H] and weight [2d, H], got {tuple(x.shape)}, "
                         f"{tuple(weight.shape)}")
    if x.stride(1) != 1 or weight.stride(1) != 1:
        raise ValueError("gate_up_silu needs x and weight contiguous in the hidden dim")
    width = weight.shape[0] // 2
    out = torch.empty((rows, width), dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    block_m = 16 if rows <= 16 else 32 if rows <= 32 else 64
    # The CPU interpreter cannot multiply bf16 (it holds it as raw uint16 bits).
    dot_dtype = tl.float32 if x.is_cpu else _DOT_DTYPES[x.dtype]
    # One pipeline stage holds an x tile and the gate and up weight tiles.
    stage_bytes = (block_m + 2 * block_n) * block_k * x.element_size()
    grid = (triton.cdiv(width, block_n), triton.cdiv(rows, block_m))
    _gate_up_silu_kernel[grid](
        x, weight, out, rows, width, hidden_size,
        x.stride(0), weight.stride(0), out.stride(0),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        DOT_DTYPE=dot_dtype, DOT_PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        num_stages=max(1, min(4, SHARED_MEMORY_FOR_STAGES // stage_bytes)),
    )
    return out
