"""Shard: which slice of which checkpoint tensor one of a rank's parameters holds.

Each module holds the weights of one TP rank and lists its Shards; the loader
(loader.py) fills each from the checkpoint without knowing the module.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass
class Shard:
    """A piece of a checkpoint tensor that one of this rank's parameters holds."""
    name: str                    # checkpoint tensor, HF naming
    full_shape: tuple[int, ...]  # its shape in the checkpoint
    dim: int | None              # the dim split across TP ranks; None: the whole tensor
    start: int
    size: int
    target: torch.Tensor         # the view of the parameter it fills


def param(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)
