"""The scheduler: which requests run this step, and how many of their tokens.

Each step has a budget of `max_num_batched_tokens` tokens. Running requests are
served first, decodes before unfinished prefills, then waiting requests are
admitted in arrival order (FCFS) while the budget, `max_num_seqs` and the KV
cache allow. With chunked prefill a prompt may be split across steps; without
it a prompt must fit whole into one step. When the KV cache runs out, the most
recently arrived running request is preempted: its blocks are freed and it is
recomputed later (its generated tokens become part of its prefix).

Up to `batch_queue_size` batches are in flight at once. With async scheduling at
pp=1 a request in flight is scheduled again as if the token its batch samples
had arrived (vLLM V1's async scheduling): the next batch computes that token,
which the workers sampled themselves, and the driver learns it afterwards. Its
finish is only known then; a token sampled after it is dropped. With pp > 1 the
token would come from the last stage after the next batch had passed the first,
so a request in flight waits until update_from_output() has seen its batch. A
request in flight is never preempted.

A batch tells the workers only what changed for its requests (batch_builder.py).
"""
from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from diagnose import probe
from engine.config import EngineConfig
from engine.core.batch_builder import BatchBuilder
from engine.core.block_manager import KVCacheManager
from engine.core.request import Request, RequestStatus
from engine.scheduler_output import ModelRunnerOutput, SchedulerOutput


@dataclass
class EngineCoreOutput:
    """What one step produced for one request."""
    req_id: str
    new_token_ids: list[int]
    finished: bool
    finish_reason: str | None            # "stop" or "length" when finished


@dataclass
class SchedulerStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_free: int                  # includes cached blocks that can be evicted
    num_preemptions: int                 # cumulative
    prefix_cache_queries: int            # cumulative: tokens looked up on admission
    prefix_cache_hits: int               # cumulative: tokens found in the cache
    prompt_tokens: int                   # cumulative: prompt tokens of admitted requests
    generation_tokens: int               # cumulative: sampled tokens


class Scheduler:
    def __init__(self, config: EngineConfig, num_blocks: int, max_model_len: int):
        self.config = config
        self.max_model_len = max_model_len
        self.kv = KVCacheManager(num_blocks, config.block_size, config.enable_prefix_caching)
        if -(-max_model_len // config.block_size) > self.kv.pool.num_usable:
            raise ValueError(f"the KV cache ({self.kv.pool.num_usable} blocks of {config.block_size} "
                             f"tokens) cannot hold one request of --max-model-len {max_model_len}")
        if not config.enable_chunked_prefill and config.max_num_batched_tokens < max_model_len:
            raise ValueError("without chunked prefill, --max-num-batched-tokens must be at least "
                             f"--max-model-len ({max_model_len})")
        self.requests: dict[str, Request] = {}     # unfinished, plus aborted ones still in flight
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.in_flight: Counter[str] = Counter()  # req_id -> batches in flight that hold it
        self.reschedule_in_flight = config.async_scheduling and config.pipeline_parallel_size == 1
        self.batch = BatchBuilder(self.kv)
        self.next_step = 0                        # the number the next non-empty batch gets
        self.num_arrived = 0
        self.num_preemptions = 0
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0

    # requests in and out

    def add_request(self, request: Request) -> None:
        request.sampling_params.validate()
        if request.req_id in self.requests:
            raise ValueError(f"request id {request.req_id!r} is already in use")
        if not request.prompt_token_ids:
            raise ValueError(f"request {request.req_id!r} has an empty prompt")
        if len(request.prompt_token_ids) > self.max_model_len:
            raise ValueError(f"request {request.req_id!r}: prompt of {len(request.prompt_token_ids)} "
                             f"tokens is longer than --max-model-len {self.max_model_len}")
        request.arrival = self.num_arrived
        self.num_arrived += 1
        self.requests[request.req_id] = request
        self.waiting.append(request)

    def abort_requests(self, req_ids: list[str]) -> None:
        """Finish the requests with reason "abort". One in flight keeps its blocks
        until its batch returns, since a worker may still be writing them."""
        for req_id in req_ids:
            request = self.requests.get(req_id)
            if request is None or request.is_finished:
                continue
            if request in self.waiting:
                self.waiting.remove(request)
            else:
                self.running.remove(request)
            self._finish(request, "abort")

    def has_unfinished_requests(self) -> bool:
        """Waiting or running requests remain. Batches in flight are the caller's to drain."""
        return bool(self.waiting or self.running)

    # one step

    def schedule(self) -> SchedulerOutput:
        """The next batch. Non-empty batches are numbered 0, 1, 2, ...; an empty one
        (nothing can run, e.g. everything is in flight) takes no number."""
        chunks: dict[str, tuple[Request, int]] = {}     # req_id -> (request, tokens this step)
        num_preemptions_before = self.num_preemptions
        budget = self._schedule_running(chunks, self.config.max_num_batched_tokens)
        if self.num_preemptions == num_preemptions_before:  # else admitting would only evict again
            self._schedule_waiting(chunks, budget)

        out = SchedulerOutput(step=self.next_step)
        if chunks:
            for request, num_new in chunks.values():
                self._add_to_batch(out, request, num_new)
            self.batch.seal(out)
            self.next_step += 1
            self.in_flight.update(chunks.keys())
        probe.kv_stats(out.step, self.kv.num_used, self.kv.num_free,
                       self.kv.num_allocated, self.kv.num_freed, self.num_preemptions)
        return out

    def _schedule_running(self, chunks: dict[str, tuple[Request, int]], budget: int) -> int:
        """Decodes first, then unfinished prefills. Returns the budget left."""
        ready = [(r, r.num_uncomputed) for r in self.running if self._ready(r)]
        decodes_first = [x for x in ready if x[1] == 1] + [x for x in ready if x[1] > 1]
        for request, num_uncomputed in decodes_first:
            if budget == 0:
                break
            if request.status is not RequestStatus.RUNNING:     # preempted for one before it
                continue
            num_new = min(num_uncomputed, budget)
            if self._allocate_or_preempt(request, num_new, chunks):
                chunks[request.req_id] = (request, num_new)
                budget -= num_new
        return budget

    def _ready(self, request: Request) -> bool:
        """A running request that can take a step now: it has tokens to compute, and
        if a batch in flight holds it, it may be scheduled again and will not have
        finished by length once that batch's token arrives."""
        if request.status is not RequestStatus.RUNNING or request.num_uncomputed == 0:
            return False
        if request.req_id not in self.in_flight:
            return True
        return self.reschedule_in_flight and not self._ends_by_length(request, request.num_pending)

    def _schedule_waiting(self, chunks: dict[str, tuple[Request, int]], budget: int) -> None:
        """Admit waiting requests in arrival order while budget, max_num_seqs and blocks allow."""
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            hits = self.kv.get_computed_blocks(request)
            num_cached = len(hits) * self.config.block_size
            num_new = request.num_tokens - num_cached
            if num_new > budget:
                if not self.config.enable_chunked_prefill:
                    break
                num_new = budget
            if not self.kv.allocate_slots(request, num_new, hits):
                break
            self.waiting.popleft()
            self._admit(request, num_cached)
            chunks[request.req_id] = (request, num_new)
            budget -= num_new

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput]:
        sampled = iter(model_runner_output.sampled_token_ids)
        outputs = []
        for req_id, sample in zip(scheduler_output.req_ids, scheduler_output.sample):
            self.in_flight[req_id] -= 1
            if not self.in_flight[req_id]:
                del self.in_flight[req_id]
            request = self.requests[req_id]
            token = next(sampled) if sample else None
            if sample:
                request.num_pending -= 1
            if request.is_finished:                 # aborted, or finished by an earlier batch
                self._release_if_landed(request)
                continue
            if token is None:
                continue
            request.output_token_ids.append(token)
            self.generation_tokens += 1
            finish_reason = self._finish_reason(request, token)
            if finish_reason is not None:
                self.running.remove(request)
                self._finish(request, finish_reason)
            outputs.append(EngineCoreOutput(request.req_id, [token], finish_reason is not None, finish_reason))
        return outputs

    def stats(self) -> SchedulerStats:
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting),
            kv_blocks_used=self.kv.num_used,
            kv_blocks_free=self.kv.num_free,
            num_preemptions=self.num_preemptions,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            prompt_tokens=self.prompt_tokens,
            generation_tokens=self.generation_tokens,
        )

    # helpers

    def _admit(self, request: Request, num_cached: int) -> None:
        if request.num_preemptions == 0:
            request.num_cached_tokens = num_cached
            self.prompt_tokens += len(request.prompt_token_ids)
        if self.config.enable_prefix_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += num_cached
        request.num_computed_tokens = num_cached
        request.status = RequestStatus.RUNNING
        self.running.append(request)

    def _add_to_batch(self, out: SchedulerOutput, request: Request, num_new: int) -> None:
        start = request.num_computed_tokens
        request.num_computed_tokens += num_new
        sample = request.num_computed_tokens == request.num_tokens + request.num_pending
        self.batch.add(out, request, start, sample)
        if sample:
            request.num_pending += 1

    def _allocate_or_preempt(self, request: Request, num_new: int,
                             chunks: dict[str, tuple[Request, int]]) -> bool:
        """Allocate the request's slots, preempting newer requests until they fit.
        False when the request itself was the one to go."""
        while not self.kv.allocate_slots(request, num_new):
            victim = self._pick_victim(chunks)
            if victim is None:              # the request itself is in flight: it waits a step
                return False
            self._preempt(victim)
            if victim is request:
                return False
        return True

    def _pick_victim(self, chunks: dict[str, tuple[Request, int]]) -> Request | None:
        """The most recently arrived running request not in flight nor scheduled this step."""
        candidates = [r for r in self.running if r.req_id not in self.in_flight and r.req_id not in chunks]
        return max(candidates, key=lambda r: r.arrival, default=None)

    def _preempt(self, request: Request) -> None:
        self.running.remove(request)
        self.kv.free(request)
        self.batch.drop(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)

    def _finish_reason(self, request: Request, token: int) -> str | None:
        params = request.sampling_params
        if token in params.stop_token_ids or (token in request.eos_token_ids and not params.ignore_eos):
            return "stop"
        return "length" if self._ends_by_length(request, 0) else None

    def _ends_by_length(self, request: Request, num_more: int) -> bool:
        """Whether the request is at its length limits once num_more tokens more arrive."""
        return (request.num_output_tokens + num_more >= request.sampling_params.max_tokens
                or request.num_tokens + num_more >= self.max_model_len)

    def _finish(self, request: Request, reason: str) -> None:
        """Mark the request finished; release it once no batch in flight holds it."""
        request.status = RequestStatus.FINISHED
        request.finish_reason = reason
        self.batch.drop(request)
        self._release_if_landed(request)

    def _release_if_landed(self, request: Request) -> None:
        if request.req_id not in self.in_flight:
            self.kv.free(request)
            del self.requests[request.req_id]

