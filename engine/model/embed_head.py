"""The vocabulary-parallel embedding and LM head.

The vocabulary is padded to a multiple of the TP size and split into equal row
ranges; the embedding's lookup (kernels/norm.py on a CUDA tensor, fused with the
first RMSNorm on one rank) is all-reduced, the head's logits all-gathered.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.communicator import Communicator
from engine.model.kernel_flags import fused
from engine.model.layernorm import RMSNorm, rms_norm
from engine.model.linear import linear
from engine.model.shard import Shard, param


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
        self.weight = param(self.rows_per_rank, hidden_size, dtype=dtype, device=device)

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

    packed = widened = bias = None

    def forward(self, hidden):
        logits = self.comm.all_gather(linear(hidden, self), dim=-1)
        return logits[:, :self.vocab_size].float()
