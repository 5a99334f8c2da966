"""Rotary position embedding: the cos/sin cache (with Llama 3's and linear scaling) and
the rotation of q and k (kernels/rotary.py on a CUDA tensor)."""
from __future__ import annotations

import math

import torch
from torch import nn


def rope_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim)
    if scaling is None:
        return inv_freq
    if scaling["rope_type"] == "linear":
        return inv_freq / scaling["factor"]
    if scaling["rope_type"] == "freq_factors":
        return inv_freq / torch.tensor(scaling["factors"], dtype=torch.float32)
    return _llama3_inv_freq(inv_freq, scaling)


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """Llama 3's long-context scaling: slow frequencies divided by `factor`, fast ones kept,
    and a smooth blend of the two in between."""
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_between = (wavelen >= old_context / high) & (wavelen <= old_context / low)
    return torch.where(in_between, blended, scaled)


def rope_cos_sin_cache(head_dim: int, max_positions: int, theta: float,
                       scaling: dict | None) -> torch.Tensor:
    """float32 [max_positions, head_dim]: cos of each position's angles, then their sin."""
    angles = torch.outer(torch.arange(max_positions).float(), rope_inv_freq(head_dim, theta, scaling))
    return torch.cat([angles.cos(), angles.sin()], dim=-1)


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
                 cos_sin_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, heads, head_dim] and k [T, kv_heads, head_dim] by their positions,
    HF's "rotate half" (neox) layout: dim i pairs with dim i + head_dim/2."""
    if q.is_cuda:
        from kernels.rotary import apply_rotary as apply_rotary_kernel
        return apply_rotary_kernel(q, k, positions, cos_sin_cache)
    cos, sin = cos_sin_cache[positions].unsqueeze(1).to(q.dtype).chunk(2, dim=-1)

    def rotate(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    return rotate(q), rotate(k)


class RotaryEmbedding(nn.Module):
    """One per model: every layer's attention rotates with the same cos/sin cache."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, device):
        super().__init__()
        cache = rope_cos_sin_cache(head_dim, max_positions, theta, scaling).to(device)
        self.register_buffer("cos_sin_cache", cache, persistent=False)
