"""The decoder's building blocks.

Each op is one plain function (rms_norm, embed, apply_rotary, silu_and_mul): CUDA tensors
go to its Triton kernel in kernels/, CPU tensors to the torch reference here. Products
go to cuBLAS (oneDNN on a CPU), but for one row on a GPU: kernels/gemv.py. Where two
neighbouring ops have one fused kernel (the embedding and the first RMSNorm; rotary and
the KV-cache write), the fused op's torch path is the two unfused ops, and
ENGINE_FUSED_KERNELS=0 sends CUDA tensors that way too, to compare the two. The
kernels are imported on first use, so Triton is only loaded where a GPU runs
(and the kernel tests can set TRITON_INTERPRET before it is). Modules hold
the weights of one TP rank and say, as `Shard`s, which slice of which
checkpoint tensor each of their parameters holds.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.communicator import Communicator

FUSED_KERNELS = os.environ.get("ENGINE_FUSED_KERNELS", "1") != "0"
# ENGINE_GEMV=0 sends batch-1 products to cuBLAS too, to compare the two.
GEMV = os.environ.get("ENGINE_GEMV", "1") != "0"


def fused(x: torch.Tensor) -> bool:
    """Whether x's op takes its fused kernel."""
    return x.is_cuda and FUSED_KERNELS


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


def embed(ids: torch.Tensor, table: torch.Tensor, vocab_start: int, norm_weight: torch.Tensor | None,
          eps: float):
    """table[ids - vocab_start] with zeros for ids outside the table; with a norm weight,
    (rms_norm(rows), rows)."""
    if fused(table):
        from kernels.norm import embed as embed_kernel
        return embed_kernel(ids, table, vocab_start, norm_weight, eps)
    local_ids = ids - vocab_start
    mine = (local_ids >= 0) & (local_ids < table.shape[0])
    rows = F.embedding(torch.where(mine, local_ids, 0), table).masked_fill_(~mine.unsqueeze(-1), 0)
    return rows if norm_weight is None else (rms_norm(rows, norm_weight, eps), rows)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, for x = [gate | up] along the last dim."""
    if x.is_cuda:
        from kernels.activation import silu_and_mul as silu_and_mul_kernel
        return silu_and_mul_kernel(x)
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


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


@dataclass
class Shard:
    """A piece of a checkpoint tensor that one of this rank's parameters holds."""
    name: str                    # checkpoint tensor, HF naming
    full_shape: tuple[int, ...]  # its shape in the checkpoint
    dim: int | None              # the dim split across TP ranks; None: the whole tensor
    start: int
    size: int
    target: torch.Tensor         # the view of the parameter it fills


def _param(*shape: int, dtype: torch.dtype, device) -> nn.Parameter:
    return nn.Parameter(torch.zeros(shape, dtype=dtype, device=device), requires_grad=False)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, device):
        super().__init__()
        self.eps = eps
        self.weight = _param(size, dtype=dtype, device=device)

    def forward(self, x, residual=None):
        return rms_norm(x, self.weight, self.eps, residual)

    def shards(self, name: str) -> list[Shard]:
        size = self.weight.shape[0]
        return [Shard(f"{name}.weight", (size,), None, 0, size, self.weight)]


class RotaryEmbedding(nn.Module):
    """One per model: every layer's attention rotates with the same cos/sin cache."""

    def __init__(self, head_dim: int, max_positions: int, theta: float, scaling: dict | None, device):
        super().__init__()
        cache = rope_cos_sin_cache(head_dim, max_positions, theta, scaling).to(device)
        self.register_buffer("cos_sin_cache", cache, persistent=False)


def linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    """x W^T (+ b) with a projection's weight, or with the copy pack_linears made of it."""
    if module.packed is not None:
        return torch.ops.mkldnn._linear_pointwise(x, module.packed, module.bias, "none", [], "")
    if _takes_gemv(x, module):
        from kernels.gemv import gemv
        return gemv(x, module.weight)
    return F.linear(x, module.weight, module.bias)


def _takes_gemv(x: torch.Tensor, module: nn.Module) -> bool:
    """One row times a 16-bit weight without a bias: kernels/gemv.py reads such a weight
    faster than cuBLAS (on an H200: docs/performance.md, "Batch-1 products")."""
    return (GEMV and x.shape[0] == 1 and fused(x) and module.bias is None and x.stride(-1) == 1
            and module.weight.element_size() == 2)


def pack_linears(model: nn.Module) -> None:
    """On a CPU, reorder each bfloat16 projection's weight once into the blocked layout
    oneDNN computes in, instead of at every product (the same numbers; the tiny test
    Llama's LM head at 16 rows took 3.5 ms, now 2.1, its layers' products 1.3-1.7x
    less). The plain weight is dropped; a tied embedding keeps its own."""
    if not (torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return
    for module in model.modules():
        if (isinstance(module, (ColumnParallelLinear, RowParallelLinear, ParallelLMHead))
                and module.weight.device.type == "cpu" and module.weight.dtype == torch.bfloat16):
            module.packed = torch.ops.mkldnn._reorder_linear_weight(module.weight, None)
            module.weight = None


class ColumnParallelLinear(nn.Module):
    """y = x W^T (+ b), W's output rows split across TP ranks. A fused projection lists its
    parts in `output_sizes`; each part is split on its own, so rank r holds the r-th slice of
    every part, side by side."""
    packed = None

    def __init__(self, input_size: int, output_sizes: list[int], comm: Communicator, bias: bool,
                 dtype: torch.dtype, device):
        super().__init__()
        self.input_size = input_size
        self.output_sizes = output_sizes
        self.local_sizes = [size // comm.tp_size for size in output_sizes]
        self.tp_rank = comm.tp_rank
        self.weight = _param(sum(self.local_sizes), input_size, dtype=dtype, device=device)
        self.bias = _param(sum(self.local_sizes), dtype=dtype, device=device) if bias else None

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
    packed = bias = None

    def __init__(self, input_size: int, output_size: int, comm: Communicator,
                 dtype: torch.dtype, device):
        super().__init__()
        self.comm = comm
        self.input_size = input_size
        self.weight = _param(output_size, input_size // comm.tp_size, dtype=dtype, device=device)

    def forward(self, x):
        return self.comm.all_reduce(linear(x, self))

    def shards(self, name: str) -> list[Shard]:
        local = self.weight.shape[1]
        return [Shard(f"{name}.weight", (self.weight.shape[0], self.input_size), 1,
                      self.comm.tp_rank * local, local, self.weight)]


class VocabParallelEmbedding(nn.Module):
    """The vocabulary, padded to a multiple of the TP size, split into equal row ranges.
    Each rank looks up the ids in its range, zeros elsewhere, and the all-reduce sums them."""

    def __init__(self, vocab_size: int, hidden_size: int, comm: Communicator,
                 dtype: torch.dtype, device):
        super().__init__()
        self.comm = comm
        self.vocab_size = vocab_size
        self.rows_per_rank = -(-vocab_size // comm.tp_size)
        self.vocab_start = comm.tp_rank * self.rows_per_rank
        self.weight = _param(self.rows_per_rank, hidden_size, dtype=dtype, device=device)

    def forward(self, input_ids, norm: RMSNorm | None = None):
        """The embeddings; with `norm` (the first layer's), (norm(embeddings), embeddings),
        one kernel on one rank."""
        if self.comm.tp_size == 1 and norm is not None:
            return embed(input_ids, self.weight, 0, norm.weight, norm.eps)
        out = self.comm.all_reduce(embed(input_ids, self.weight, self.vocab_start, None, 0.0))
        return out if norm is None else (norm(out), out)

    def shards(self, name: str) -> list[Shard]:
        real_rows = max(0, min(self.rows_per_rank, self.vocab_size - self.vocab_start))
        return [Shard(f"{name}.weight", (self.vocab_size, self.weight.shape[1]), 0,
                      self.vocab_start, real_rows, self.weight[:real_rows])]


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, split like the embedding: local logits, then all-gathered."""

    packed = bias = None

    def forward(self, hidden):
        logits = self.comm.all_gather(linear(hidden, self), dim=-1)
        return logits[:, :self.vocab_size].float()
