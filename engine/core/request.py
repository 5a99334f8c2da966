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
    num_pending: int = 0                 # sampled by batches in flight, not yet seen by the driver
    num_blocks_sent: int | None = None   # blocks of its table the workers hold; None: not on them

    def __post_init__(self):
        self.prompt_token_ids = list(self.prompt_token_ids)
        self.eos_token_ids = tuple(self.eos_token_ids)

    def token_slice(self, start: int, end: int) -> list[int]:
        """Known tokens start:end (the prompt, then the output), without joining the two."""
        split = len(self.prompt_token_ids)
        if end <= split:
            return self.prompt_token_ids[start:end]
        if start >= split:
            return self.output_token_ids[start - split:end - split]
        return self.prompt_token_ids[start:] + self.output_token_ids[:end - split]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_uncomputed(self) -> int:
        """Tokens known or pending whose KV is not in the cache yet."""
        return self.num_tokens + self.num_pending - self.num_computed_tokens

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED
