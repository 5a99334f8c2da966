"""The data the driver sends to the workers each step, and what comes back."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ScheduledRequest:
    req_id: str
    token_ids: list[int]   # the tokens computed this step (a prefill chunk, or 1 decode token)
    start_pos: int         # position of token_ids[0] (= tokens already in the KV cache)
    block_ids: list[int]   # the request's whole block table
    sample: bool           # this step reaches the end of the known tokens: sample one
    temperature: float
    top_k: int             # 0 = off
    top_p: float           # 1.0 = off
    seed: int | None
    num_output_tokens: int # tokens generated so far (seeded sampling is keyed on it)


@dataclass
class SchedulerOutput:
    step: int
    requests: list[ScheduledRequest]


@dataclass
class ModelRunnerOutput:
    step: int
    req_ids: list[str]          # the requests with sample=True, in order
    sampled_token_ids: list[int]
