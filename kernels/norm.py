"""RMSNorm, optionally fused with the residual add before it, one program per row; and the
embedding gather, alone or fused with the first layer's RMSNorm."""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, new_residual_ptr,
    stride_x_row, stride_residual_row,
    hidden_size, eps,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < hidden_size
    x = tl.load(x_ptr + row * stride_x_row + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RESIDUAL:
        x += tl.load(residual_ptr + row * stride_residual_row + cols, mask=mask, other=0.0).to(tl.float32)
        x = x.to(new_residual_ptr.dtype.element_ty)
        tl.store(new_residual_ptr + row * hidden_size + cols, x, mask=mask)
        x = x.to(tl.float32)
    _normalize(x, weight_ptr, out_ptr + row * hidden_size, cols, mask, hidden_size, eps)


@triton.jit
def _normalize(x, weight_ptr, out_row_ptr, cols, mask, hidden_size, eps):
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / hidden_size + eps)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    out = x * inv_rms * weight
    tl.store(out_row_ptr + cols, out.to(out_row_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _embed_kernel(
    ids_ptr, table_ptr, weight_ptr, out_ptr, embedded_ptr,
    stride_table_row, vocab_start, table_rows, hidden_size, eps,
    NORM: tl.constexpr,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    local_id = tl.load(ids_ptr + row).to(tl.int64) - vocab_start
    mine = (local_id >= 0) & (local_id < table_rows)
    mask = cols < hidden_size
    x = tl.load(table_ptr + tl.where(mine, local_id, 0) * stride_table_row + cols, mask=mask, other=0.0)
    x = tl.where(mine, x, 0.0).to(x.dtype)
    tl.store(embedded_ptr + row * hidden_size + cols, x, mask=mask)
    if NORM:
        _normalize(x.to(tl.float32), weight_ptr, out_ptr + row * hidden_size, cols, mask, hidden_size, eps)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """x [..., hidden] -> out; with residual, (out, x + residual) and the norm is of x + residual."""
    hidden_size = x.shape[-1]
    if weight.shape != (hidden_size,):
        raise ValueError(f"rms_norm weight has shape {tuple(weight.shape)}, expected ({hidden_size},)")
    if residual is not None and residual.shape != x.shape:
        raise ValueError(f"rms_norm residual has shape {tuple(residual.shape)}, x has {tuple(x.shape)}")
    rows = _as_rows(x)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new_residual = torch.empty_like(out) if residual is not None else out
    residual_rows = _as_rows(residual) if residual is not None else rows
    if rows.shape[0] > 0:
        block = triton.next_power_of_2(hidden_size)
        _rms_norm_kernel[(rows.shape[0],)](
            rows, residual_rows, weight, out, new_residual,
            rows.stride(0), residual_rows.stride(0),
            hidden_size, eps,
            HAS_RESIDUAL=residual is not None,
            BLOCK=block,
            num_warps=min(max(block // 256, 1), 16),
        )
    return out if residual is None else (out, new_residual)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])
    return rows if rows.stride(1) == 1 else rows.contiguous()


def embed(ids: torch.Tensor, table: torch.Tensor, vocab_start: int = 0,
          weight: torch.Tensor | None = None, eps: float = 0.0):
    """Rows table[ids - vocab_start] [T, hidden], zeros for ids outside the table's range (a
    TP rank's slice of the vocabulary). With a norm weight: (rms_norm(rows), rows), one launch."""
    hidden_size = table.shape[1]
    if ids.dim() != 1 or table.stride(1) != 1:
        raise ValueError(f"embed needs ids [T] and a table contiguous in its rows, got ids {tuple(ids.shape)}")
    if weight is not None and weight.shape != (hidden_size,):
        raise ValueError(f"embed's norm weight has shape {tuple(weight.shape)}, expected ({hidden_size},)")
    embedded = torch.empty((ids.shape[0], hidden_size), dtype=table.dtype, device=table.device)
    out = torch.empty_like(embedded) if weight is not None else embedded
    if ids.shape[0] > 0:
        block = triton.next_power_of_2(hidden_size)
        _embed_kernel[(ids.shape[0],)](
            ids, table, weight if weight is not None else table, out, embedded,
            table.stride(0), vocab_start, table.shape[0], hidden_size, eps,
            NORM=weight is not None,
            BLOCK=block,
            num_warps=min(max(block // 256, 1), 16),
        )
    return embedded if weight is None else (out, embedded)
