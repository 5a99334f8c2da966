"""The data the driver sends to the workers each step, and what comes back.

A request's block table and sampling settings cross once, in `new_requests`, the
first step it is in (and again after a preemption); the workers keep them until
`finished_req_ids` names it. Every step then carries only what changed for each
request in the batch: its new tokens, its position, the blocks added to its table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

PENDING_TOKEN = -1   # a token an earlier step sampled that the driver has not seen yet


@dataclass
class RequestSampling:
    temperature: float
    top_k: int             # 0 = off
    top_p: float           # 1.0 = off
    seed: int | None
    num_output_tokens: int # tokens generated so far (seeded sampling is keyed on it); the
                           # workers count on from the value they were sent


@dataclass
class NewRequest:
    """A request the workers do not hold: everything they keep of it."""
    req_id: str
    block_ids: list[int]   # its whole block table so far
    sampling: RequestSampling


@dataclass
class SchedulerOutput:
    step: int
    req_ids: list[str] = field(default_factory=list)         # the batch, in row order
    start_pos: list[int] = field(default_factory=list)       # tokens of each already in the KV cache
    token_ids: list[list[int]] = field(default_factory=list)  # the tokens each computes; PENDING_TOKEN
                                                              # for the one its last step sampled
    sample: list[bool] = field(default_factory=list)         # reaches the end of its tokens: sample one
    new_block_ids: list[list[int]] = field(default_factory=list)  # appended to each one's table
    new_requests: list[NewRequest] = field(default_factory=list)  # those of the batch first sent now
    finished_req_ids: list[str] = field(default_factory=list)     # the workers drop these first


@dataclass
class ModelRunnerOutput:
    step: int
    sampled_token_ids: list[int]   # one per request of the batch with sample=True, in row order
