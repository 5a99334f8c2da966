"""The MLP's activation: silu(gate) * up (kernels/activation.py on a CUDA tensor)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, for x = [gate | up] along the last dim."""
    if x.is_cuda:
        from kernels.activation import silu_and_mul as silu_and_mul_kernel
        return silu_and_mul_kernel(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up
