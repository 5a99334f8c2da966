"""Host lists to the device without waiting for the device.

A plain host-to-device copy on a GPU returns only once the stream has run everything
queued before it: the step in flight, when the worker prepares the next one. From
pinned memory, a non-blocking copy is queued like a kernel instead; torch's pinned
memory pool keeps the buffer until the copy has run.
"""
from __future__ import annotations

import torch


def to_device(values: list, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if device.type != "cuda":
        return torch.tensor(values, dtype=dtype)
    return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
