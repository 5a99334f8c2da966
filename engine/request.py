"""Request: the driver's state of one request, owned and updated by the scheduler."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"      # waiting again, its KV cache dropped; recomputed when re-admitted
    FINISHED = "finished"


@dataclass(eq=False)                     # compared by identity
class Request:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...] = ()
    arrival: int = 0                     # order of arrival, set by the scheduler
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0         # tokens whose KV is in the cache (or is being written)
    status: RequestStatus = RequestStatus.WAITING
    finish_reason: str | None = None     # "stop", "length" or "abort"
    num_cached_tokens: int = 0           # prompt tokens found in the prefix cache on first admission
    num_preemptions: int = 0

    def __post_init__(self):
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.eos_token_ids = tuple(self.eos_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
