"""ModelInputs: one step's input tensors for this stage's forward, eager or replayed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.model.attention import AttentionMetadata


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # row of each sampled request's last token
