"""RMSNorm, with the residual add fused in as vLLM does it.

A CUDA tensor goes to kernels/norm.py, a CPU tensor to the torch reference here.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.model.shard import Shard, param


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None):
    """RMSNorm of x, or with a residual: (norm(x + residual), x + residual), as vLLM fuses it."""
    if x.is_cuda:
        from kernels.norm import rms_norm as rms_norm_kernel
        return rms_norm_kernel(x, weight, eps, residual)
    if residual is not None:
        x = x + residual
        residual = x
    x32 = x.float()
    out = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return out if residual is None else (out, residual)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = param(size, dtype=dtype, device=device)

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, residual)

    def shards(self, name: str) -> list[Shard]:
        size = self.weight.shape[0]
        return [Shard(f"{name}.weight", (size,), None, 0, size, self.weight)]
