"""What the workers hold of each request, and the batch that tells them what changed.

A request crosses in full (a NewRequest: its block table so far and its sampling
settings) the first step it is in, and again after the workers dropped it (a
preemption); then each step only its tokens, its position and the blocks its
table gained. The requests that left (finished, aborted, preempted) are named
in the next batch: the workers run every batch sent before it, which may still
hold them, first.
"""
from __future__ import annotations

from engine.core.block_manager import KVCacheManager
from engine.core.request import Request
from engine.scheduler_output import PENDING_TOKEN, NewRequest, RequestSampling, SchedulerOutput


class BatchBuilder:
    def __init__(self, kv: KVCacheManager):
        self.kv = kv
        self.dropped: list[str] = []

    def add(self, out: SchedulerOutput, request: Request, start: int, sample: bool) -> None:
        """The request computes its tokens start..num_computed_tokens this step; those
        past its known tokens are the ones its batches in flight sample."""
        end = request.num_computed_tokens
        known = max(start, min(end, request.num_tokens))
        out.req_ids.append(request.req_id)
        out.start_pos.append(start)
        out.token_ids.append(request.token_slice(start, known) + [PENDING_TOKEN] * (end - known))
        out.sample.append(sample)
        if request.num_blocks_sent is None:
            out.new_requests.append(self._new_request(request))
            out.new_block_ids.append([])
            request.num_blocks_sent = len(out.new_requests[-1].block_ids)
        else:
            new_blocks = self.kv.block_ids(request, request.num_blocks_sent)
            out.new_block_ids.append(new_blocks)
            request.num_blocks_sent += len(new_blocks)

    def seal(self, out: SchedulerOutput) -> None:
        """The batch is complete: it also names the requests that left the workers."""
        out.finished_req_ids, self.dropped = self.dropped, []

    def drop(self, request: Request) -> None:
        if request.num_blocks_sent is not None:
            self.dropped.append(request.req_id)
            request.num_blocks_sent = None

    def _new_request(self, request: Request) -> NewRequest:
        params = request.sampling_params
        return NewRequest(request.req_id, self.kv.block_ids(request), RequestSampling(
            temperature=params.temperature, top_k=max(params.top_k, 0), top_p=params.top_p,
            seed=params.seed, num_output_tokens=request.num_output_tokens))
