"""SamplingParams: how one request is sampled and when it stops (vLLM's names).

validate() is the one check of every front end (the HTTP server, LLM.generate,
the CLI), so that no request reaches a worker with values it cannot sample with.
"""
from __future__ import annotations

from dataclasses import dataclass, field

GREEDY_BELOW = 1e-5            # a temperature under this samples greedily (vLLM's _SAMPLING_EPS)
MAX_TEMPERATURE = 2.0          # OpenAI's range is [0, 2]
MAX_TOP_K = 2**31 - 1          # int32, as vLLM's top_k tensor
SEED_RANGE = (-2**63, 2**63 - 1)  # int64, as vLLM's OpenAI server takes it
MAX_STOP_STRINGS = 16
MAX_STOP_CHARS = 256


class SamplingParamsError(ValueError):
    """A parameter that cannot work; `param` names it as the OpenAI API does."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


@dataclass
class SamplingParams:
    temperature: float = 1.0             # 0 (or under GREEDY_BELOW): greedy
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
        """Raise SamplingParamsError (a ValueError) with a one-line message for the first
        parameter that cannot work. The comparisons are written so that NaN fails them."""
        if not self.max_tokens >= 1:
            raise SamplingParamsError("max_tokens", f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise SamplingParamsError("temperature", f"temperature must be in [0, {MAX_TEMPERATURE:g}], "
                                      f"got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise SamplingParamsError("top_p", f"top_p must be in (0, 1], got {self.top_p}")
        if not -1 <= self.top_k <= MAX_TOP_K:
            raise SamplingParamsError("top_k", f"top_k must be -1 or 0 (off) or in 1..{MAX_TOP_K}, "
                                      f"got {self.top_k}")
        if self.seed is not None and not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
            raise SamplingParamsError("seed", f"seed must be in {SEED_RANGE[0]}..{SEED_RANGE[1]}, "
                                      f"got {self.seed}")
        self._validate_stops()

    def _validate_stops(self) -> None:
        if len(self.stop) > MAX_STOP_STRINGS:
            raise SamplingParamsError("stop", f"stop takes at most {MAX_STOP_STRINGS} strings, "
                                      f"got {len(self.stop)}")
        if any(not 0 < len(s) <= MAX_STOP_CHARS for s in self.stop):
            raise SamplingParamsError("stop", f"stop strings must have 1 to {MAX_STOP_CHARS} characters")
        if any(t < 0 for t in self.stop_token_ids):
            raise SamplingParamsError("stop_token_ids",
                                      f"stop_token_ids must be non-negative, got {self.stop_token_ids}")
