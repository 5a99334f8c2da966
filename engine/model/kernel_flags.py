"""Which ops send CUDA tensors to our Triton kernels (kernels/), for comparing the two ways.

ENGINE_FUSED_KERNELS=0 sends CUDA tensors through the torch path of a fused op (the
embedding and the first RMSNorm; rotary and the KV-cache write): its two unfused ops.
ENGINE_GEMV=0 sends batch-1 products to cuBLAS too, ENGINE_SMALL_BATCH=0 those of 2 to
SMALL_BATCH_MAX_ROWS rows (engine/model/linear.py). ENGINE_GEMV_FOLD=0 keeps the
RMSNorm before a batch-1 product and the SiLU-and-mul after the gate/up one as kernels of
their own rather than folded into the gemv. All are read at every op from this
module, so a benchmark may flip them between runs.
"""
from __future__ import annotations

import os

import torch

FUSED_KERNELS = os.environ.get("ENGINE_FUSED_KERNELS", "1") != "0"
GEMV = os.environ.get("ENGINE_GEMV", "1") != "0"
GEMV_FOLD = os.environ.get("ENGINE_GEMV_FOLD", "1") != "0"
SMALL_BATCH = os.environ.get("ENGINE_SMALL_BATCH", "1") != "0"


def fused(x: torch.Tensor) -> bool:
    """Whether x's op takes its fused kernel."""
    return x.is_cuda and FUSED_KERNELS
