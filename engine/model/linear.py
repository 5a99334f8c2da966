"""The projections: column- and row-parallel linears, and the one product they all use.

Products go to cuBLAS (oneDNN on a CPU), but on a GPU: one row to kernels/gemv.py, which
also folds in the RMSNorm before a product and the SiLU-and-mul after it; 2 to
SMALL_BATCH_MAX_ROWS rows to kernels/small_batch.py, which folds in the SiLU-and-mul.
On a CPU a bfloat16 weight is prepared once (pack_linears): packed into oneDNN's
blocked layout where the CPU has bfloat16 dot products, else widened to float32; every
projection that `linear` computes declares `packed` and `widened` for them.
"""
from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch import nn

from engine.communicator import Communicator
from engine.model import kernel_flags
from engine.model.activation import silu_and_mul
from engine.model.layernorm import RMSNorm
from engine.model.shard import Shard, param

# A norm folded into a gemv costs each of its programs a read of the whole row: on an
# H200 it wins where they are few (the 8B's qkv, 6144 rows: 18.0 us against 19.6 for
# the norm's kernel then gemv) and loses where they are many (its gate/up, 28672 rows:
# 80.4 against 69.7 us). benchmarks/gpu_gemv_fold.py, part (b).
NORM_FOLD_MAX_ROWS = 8192
# Products of 2 to this many rows go to kernels/small_batch.py: on an H200 it beats cuBLAS
# by up to 5.6 us a layer at 8B batch 32 and loses by 1.4-1.9x at 128 (docs/performance.md,
# "Small-batch products on the matrix units").
SMALL_BATCH_MAX_ROWS = 32


def linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """x W^T (+ b) with a projection's weight, or with the copy pack_linears made of it."""
    if module.packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, module.packed, module.bias, "none", [], "")
    if module.widened is not None:
        return F.linear(x.float(), module.widened, module.bias).to(x.dtype)
    if _takes_gemv(x, module):
        from kernels.gemv import gemv
        return gemv(x, module.weight)
    if _takes_small_batch(x, module):
        from kernels.small_batch import small_batch_matmul
        return small_batch_matmul(x, module.weight)
    return F.linear(x, module.weight, module.bias)


def normed_linear(x: torch.Tensor, residual: torch.Tensor, norm: RMSNorm | None, module: nn.Module,
                  then_silu_and_mul: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """The product of norm(x, residual) (of x, normed already, without a norm), then
    silu_and_mul of it if asked; and the residual the norm passes on. A one-row product
    is a gemv with the activation folded in, and the norm too where it has few rows."""
    fold = kernel_flags.GEMV_FOLD and _takes_gemv(x, module)
    if norm is not None and fold and module.weight.shape[0] <= NORM_FOLD_MAX_ROWS:
        from kernels.gemv import gemv
        return gemv(x, module.weight, norm.weight, norm.eps, residual, silu_and_mul=then_silu_and_mul)
    if norm is not None:
        x, residual = norm(x, residual)
    if fold and then_silu_and_mul:
        from kernels.gemv import gemv
        return gemv(x, module.weight, silu_and_mul=True), residual
    if then_silu_and_mul and _takes_small_batch(x, module):
        from kernels.small_batch import small_batch_matmul
        return small_batch_matmul(x, module.weight, silu_and_mul=True), residual
    out = linear(x, module)
    return (silu_and_mul(out) if then_silu_and_mul else out), residual


def _takes_gemv(x: torch.Tensor, module: nn.Module) -> bool:
    """One row times a 16-bit weight without a bias: kernels/gemv.py reads such a weight
    faster than cuBLAS (on an H200: docs/performance.md, "Batch-1 products")."""
    return kernel_flags.GEMV and x.shape[0] == 1 and _takes_triton(x, module)


def _takes_small_batch(x: torch.Tensor, module: nn.Module) -> bool:
    """2 to SMALL_BATCH_MAX_ROWS rows times a 16-bit weight without a bias."""
    return kernel_flags.SMALL_BATCH and 2 <= x.shape[0] <= SMALL_BATCH_MAX_ROWS and _takes_triton(x, module)


def _takes_triton(x: torch.Tensor, module: nn.Module) -> bool:
    return (kernel_flags.fused(x) and module.bias is None and x.stride(-1) == 1
            and module.weight.element_size() == 2)


def pack_linears(model: nn.Module) -> None:
    """On a CPU, prepare each bfloat16 projection's weight once for the products. With
    bfloat16 dot products (AVX-512 BF16, AMX) it is reordered into the blocked layout
    oneDNN computes in, instead of at every product (the same numbers; the tiny test
    Llama's LM head at 16 rows took 3.5 ms, now 2.1, its layers' products 1.3-1.7x
    less). Without them (AVX2) oneDNN widens the weight to float32 at every product: it
    is widened once instead, and the product, summed in float32 as oneDNN's is, rounded
    back to bfloat16 (the LM head at 16 rows on an AVX2 EPYC: 27.7 ms, now 15.5; twice
    the weight's memory: ENGINE_WIDEN_BF16=0 keeps them bfloat16, for a host short of
    memory). The plain weight is dropped; a tied embedding keeps its own."""
    if not torch.backends.mkldnn.is_available():
        return
    pack = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    if not pack and os.environ.get("ENGINE_WIDEN_BF16", "1") == "0":
        return
    for module in model.modules():
        if (hasattr(module, "packed")
                and module.weight.device.type == "cpu" and module.weight.dtype == torch.bfloat16):
            if pack:
                module.packed = torch.ops.mkldnn._reorder_linear_weight(module.weight, None)
            else:
                module.widened = module.weight.float()
                if module.bias is not None:
                    module.bias = nn.Parameter(module.bias.float(), requires_grad=False)
            module.weight = None


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), W's output rows split across TP ranks. A fused projection lists its
    parts in `output_sizes`; each part is split on its own, so rank r holds the r-th slice of
    every part, side by side."""
    packed = widened = None

    def __init__(self, input_size: int, output_sizes: list[int], comm: Communicator, bias: bool,
                 dtype: torch.dtype, device):
        super().__init__()
        self.input_size = input_size
        self.output_sizes = output_sizes
        self.local_sizes = [size // comm.tp_size for size in output_sizes]
        self.tp_rank = comm.tp_rank
        self.weight = param(sum(self.local_sizes), input_size, dtype=dtype, device=device)
        self.bias = param(sum(self.local_sizes), dtype=dtype, device=device) if bias else None

    def forward(self, x):
        return linear(x, self)

    def shards(self, names: list[str]) -> list[Shard]:
        """`names`: the checkpoint module of each part, e.g. [...q_proj, ...k_proj, ...v_proj]."""
        shards, offset = [], 0
        for name, full, local in zip(names, self.output_sizes, self.local_sizes):
            start = self.tp_rank * local
            shards.append(Shard(f"{name}.weight", (full, self.input_size), 0, start, local,
                                self.weight[offset:offset + local]))
            if self.bias is not None:
                shards.append(Shard(f"{name}.bias", (full,), 0, start, local,
                                    self.bias[offset:offset + local]))
            offset += local
        return shards


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; each rank holds whole heads."""

    def __init__(self, hidden_size: int, head_dim: int, num_heads: int, num_kv_heads: int,
                 comm: Communicator, bias: bool, dtype: torch.dtype, device):
        super().__init__(hidden_size, [num_heads * head_dim, num_kv_heads * head_dim,
                                       num_kv_heads * head_dim], comm, bias, dtype, device)

    def split(self, qkv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return qkv.split(self.local_sizes, dim=-1)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """The MLP's gate and up projections in one matmul: output [gate | up] for silu_and_mul."""

    def __init__(self, input_size: int, intermediate_size: int, comm: Communicator,
                 dtype: torch.dtype, device):
        super().__init__(input_size, [intermediate_size] * 2, comm, False, dtype, device)


class RowParallelLinear(nn.Module):
    """y = x W^T, W's input columns split across TP ranks; the partial sums are all-reduced."""
    packed = widened = bias = None

    def __init__(self, input_size: int, output_size: int, comm: Communicator,
                 dtype: torch.dtype, device):
        super().__init__()
        self.comm = comm
        self.input_size = input_size
        self.weight = param(output_size, input_size // comm.tp_size, dtype=dtype, device=device)

    def forward(self, x):
        return self.comm.all_reduce(linear(x, self))

    def shards(self, name: str) -> list[Shard]:
        local = self.weight.shape[1]
        return [Shard(f"{name}.weight", (self.weight.shape[0], self.input_size), 1,
                      self.comm.tp_rank * local, local, self.weight)]
