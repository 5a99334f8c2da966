"""SamplingParams: how one request is sampled and when it stops (vLLM's names)."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    temperature: float = 1.0             # 0: greedy
    top_p: float = 1.0                   # 1.0: off
    top_k: int = 0                       # 0 or -1: off
    max_tokens: int = 16
    seed: int | None = None              # per-request seed: same tokens whatever the batch
    stop: list[str] = field(default_factory=list)   # stop strings (handled by the detokenizer)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]

    def validate(self) -> None:
        """Raise ValueError with a one-line message for parameters that cannot work."""
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be non-negative, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise ValueError(f"top_k must be -1, 0 (off) or positive, got {self.top_k}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must not be empty")
        if any(t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
