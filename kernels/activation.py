"""SwiGLU's gate: silu(x[..., :d]) * x[..., d:]."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

COLUMN_TILE = 1024


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
