"""Scheduler driven by a deterministic fake model that keeps its own paged "KV cache".

The fake model writes every scheduled token into the slot its block table and
position name, and predicts the next token from the context it reads back
through the block table. A wrong block table, a block shared by mistake or a
lost recompute therefore changes the generated tokens.
"""
from collections import deque

import pytest

from engine.config import EngineConfig
from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.sampling_params import SamplingParams
from engine.scheduler_output import PENDING_TOKEN, ModelRunnerOutput, SchedulerOutput

VOCAB = 1000


def next_token(context):
    return sum((i + 1) * t for i, t in enumerate(context)) * 2654435761 % VOCAB


def reference(prompt, max_tokens):
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt):]


class FakeModel:
    """A worker's part: it holds each request's block table from the step the request
    arrives in, applies each step's new blocks, and puts the token it sampled last for a
    request where a step says PENDING_TOKEN."""

    def __init__(self, block_size):
        self.block_size = block_size
        self.cache = {}                           # slot -> token
        self.tables = {}                          # req_id -> block ids
        self.last_sampled = {}

    def slot(self, req_id, pos):
        return self.tables[req_id][pos // self.block_size] * self.block_size + pos % self.block_size

    def execute(self, output: SchedulerOutput) -> ModelRunnerOutput:
        for req_id in output.finished_req_ids:
            del self.tables[req_id]
        for new in output.new_requests:
            self.tables[new.req_id] = list(new.block_ids)
        for req_id, new_blocks in zip(output.req_ids, output.new_block_ids):
            self.tables[req_id] += new_blocks
        rows = list(zip(output.req_ids, output.start_pos, output.token_ids, output.sample))
        for req_id, start, tokens, _ in rows:     # like a layer: write all new KV first...
            for i, token in enumerate(tokens):
                known = self.last_sampled[req_id] if token == PENDING_TOKEN else token
                self.cache[self.slot(req_id, start + i)] = known
        sampled = []
        for req_id, start, tokens, sample in rows:  # ...then attend
            if sample:
                context = [self.cache[self.slot(req_id, p)] for p in range(start + len(tokens))]
                self.last_sampled[req_id] = next_token(context)
                sampled.append(self.last_sampled[req_id])
        return ModelRunnerOutput(output.step, sampled)


def batch(output: SchedulerOutput) -> list[tuple[str, int]]:
    """(req_id, tokens this step) of each request in the batch."""
    return [(req_id, len(tokens)) for req_id, tokens in zip(output.req_ids, output.token_ids)]


def make_scheduler(num_blocks=64, max_model_len=64, **config):
    config = EngineConfig(**{"block_size": 4, "max_num_batched_tokens": 32, **config})
    return Scheduler(config, num_blocks=num_blocks, max_model_len=max_model_len)


def make_request(req_id, prompt, max_tokens=4, **params):
    return Request(req_id, list(prompt), SamplingParams(max_tokens=max_tokens, temperature=0, **params))


def run_to_completion(scheduler, model, max_steps=500):
    """The engine core's loop, with up to batch_queue_size batches in flight."""
    tokens, reasons, in_flight = {}, {}, deque()
    for _ in range(max_steps):
        if not scheduler.has_unfinished_requests() and not in_flight:
            return tokens, reasons
        output = scheduler.schedule()
        if output.req_ids:
            in_flight.append((output, model.execute(output)))
        if in_flight and (len(in_flight) == scheduler.config.batch_queue_size or not output.req_ids):
            for result in scheduler.update_from_output(*in_flight.popleft()):
                tokens.setdefault(result.req_id, []).extend(result.new_token_ids)
                if result.finished:
                    reasons[result.req_id] = result.finish_reason
    raise AssertionError("requests did not finish")


def step(scheduler, model):
    output = scheduler.schedule()
    results = scheduler.update_from_output(output, model.execute(output))
    return output, results


def test_budget_is_respected_and_chunked_prefill_splits_a_long_prompt():
    scheduler, model = make_scheduler(max_num_batched_tokens=8), FakeModel(4)
    prompt = list(range(1, 21))
    scheduler.add_request(make_request("long", prompt))
    chunks = []
    for _ in range(3):
        output, _ = step(scheduler, model)
        chunks += zip(output.start_pos, map(len, output.token_ids), output.sample)
    assert chunks == [(0, 8, False), (8, 8, False), (16, 4, True)]
    tokens, _ = run_to_completion(scheduler, model)
    assert scheduler.requests == {} and scheduler.kv.num_used == 0


def test_decodes_go_first_and_share_the_budget_with_prefills():
    scheduler, model = make_scheduler(max_num_batched_tokens=8), FakeModel(4)
    scheduler.add_request(make_request("short", [5, 6, 7], max_tokens=10))
    step(scheduler, model)                        # prefill of "short"
    scheduler.add_request(make_request("long", range(1, 30)))
    output, _ = step(scheduler, model)
    assert batch(output) == [("short", 1), ("long", 7)]
    output, _ = step(scheduler, model)
    assert batch(output) == [("short", 1), ("long", 7)]


def test_decodes_go_before_an_unfinished_chunked_prefill_that_arrived_earlier():
    scheduler, model = make_scheduler(max_num_batched_tokens=8, pipeline_parallel_size=2), FakeModel(4)
    scheduler.add_request(make_request("long", range(1, 31)))
    first = scheduler.schedule()                  # "long" chunk 1, in flight
    scheduler.add_request(make_request("short", [5, 6]))
    second = scheduler.schedule()                 # "short" prefill, in flight
    for output in (first, second):
        scheduler.update_from_output(output, model.execute(output))
    third = scheduler.schedule()
    assert batch(third) == [("short", 1), ("long", 7)]


def test_without_chunked_prefill_a_prompt_waits_for_room_in_one_step():
    scheduler = make_scheduler(max_num_batched_tokens=16, max_model_len=16, enable_chunked_prefill=False)
    model = FakeModel(4)
    scheduler.add_request(make_request("a", [1, 2], max_tokens=3))
    step(scheduler, model)
    scheduler.add_request(make_request("b", range(1, 17), max_tokens=1))
    output, _ = step(scheduler, model)            # 1 decode token leaves 15: "b" does not fit
    assert output.req_ids == ["a"]
    tokens, _ = run_to_completion(scheduler, model)
    assert tokens["b"] == reference(range(1, 17), 1)


def test_max_num_seqs_limits_running_requests():
    scheduler, model = make_scheduler(max_num_seqs=2), FakeModel(4)
    for i in range(3):
        scheduler.add_request(make_request(f"r{i}", [i + 1] * 3, max_tokens=3))
    output, results = step(scheduler, model)
    assert output.req_ids == ["r0", "r1"]
    assert scheduler.stats().num_waiting == 1
    tokens, _ = run_to_completion(scheduler, model)
    for result in results:
        tokens[result.req_id][:0] = result.new_token_ids
    assert tokens == {f"r{i}": reference([i + 1] * 3, 3) for i in range(3)}


@pytest.mark.parametrize("prefix_caching", [True, False])
def test_preemption_under_a_tiny_cache_gives_the_same_tokens(prefix_caching):
    # 4 usable blocks of 4 tokens; each request needs 3 blocks at its longest
    scheduler = make_scheduler(num_blocks=5, max_model_len=16, enable_prefix_caching=prefix_caching)
    prompts = {f"r{i}": [10 * i + j for j in range(5)] for i in range(3)}
    for req_id, prompt in prompts.items():
        scheduler.add_request(make_request(req_id, prompt, max_tokens=7))
    requests = dict(scheduler.requests)
    tokens, reasons = run_to_completion(scheduler, FakeModel(4))
    assert tokens == {req_id: reference(prompt, 7) for req_id, prompt in prompts.items()}
    assert set(reasons.values()) == {"length"}
    stats = scheduler.stats()
    assert stats.num_preemptions == sum(r.num_preemptions for r in requests.values()) > 0
    # r2 waits for blocks; r0 and r1 run, and r0's growth evicts the newer running one
    assert requests["r0"].num_preemptions == 0 and requests["r1"].num_preemptions > 0
    assert stats.kv_blocks_used == 0 and stats.kv_blocks_free == 4
    assert scheduler.kv.num_allocated == scheduler.kv.num_freed


def test_abort_frees_blocks_and_the_request_never_runs_again():
    scheduler, model = make_scheduler(max_num_seqs=2), FakeModel(4)
    scheduler.add_request(make_request("keep", range(1, 9), max_tokens=3))
    scheduler.add_request(make_request("drop", range(20, 30), max_tokens=3))
    scheduler.add_request(make_request("queued", range(40, 45), max_tokens=3))
    step(scheduler, model)
    used = scheduler.kv.num_used
    scheduler.abort_requests(["drop", "queued", "unknown"])
    assert scheduler.kv.num_used == used - 3                       # "drop" held 3 blocks
    tokens, _ = run_to_completion(scheduler, model)
    assert set(tokens) == {"keep"} and scheduler.kv.num_used == 0


def test_finish_reasons_eos_stop_token_max_tokens_and_max_model_len():
    prompt = [3, 1, 4, 1, 5]
    ref = reference(prompt, 20)
    k = 2
    while ref[k] in ref[:k]:
        k += 1
    scheduler, model = make_scheduler(max_model_len=12), FakeModel(4)
    scheduler.add_request(Request("eos", prompt, SamplingParams(temperature=0, max_tokens=20), (ref[k],)))
    scheduler.add_request(Request("ignore", prompt, SamplingParams(temperature=0, max_tokens=5,
                                                                     ignore_eos=True), (ref[k],)))
    scheduler.add_request(make_request("stop_id", prompt, max_tokens=20, stop_token_ids=[ref[k]]))
    scheduler.add_request(make_request("max_tokens", prompt, max_tokens=3))
    scheduler.add_request(make_request("model_len", prompt, max_tokens=20))
    tokens, reasons = run_to_completion(scheduler, model)
    assert (tokens["eos"], reasons["eos"]) == (ref[:k + 1], "stop")
    assert (tokens["stop_id"], reasons["stop_id"]) == (ref[:k + 1], "stop")
    assert (tokens["ignore"], reasons["ignore"]) == (ref[:5], "length")
    assert (tokens["max_tokens"], reasons["max_tokens"]) == (ref[:3], "length")
    assert (tokens["model_len"], reasons["model_len"]) == (ref[:12 - len(prompt)], "length")


def test_in_flight_requests_are_not_rescheduled_with_two_batches_in_flight():
    scheduler, model = make_scheduler(pipeline_parallel_size=2), FakeModel(4)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=5))
    first = scheduler.schedule()
    scheduler.add_request(make_request("b", [4, 5, 6], max_tokens=5))
    second = scheduler.schedule()
    assert first.req_ids == ["a"] and second.req_ids == ["b"]
    third = scheduler.schedule()
    assert third.req_ids == [] and second.step == first.step + 1 == 1
    scheduler.update_from_output(first, model.execute(first))
    assert scheduler.schedule().req_ids == ["a"]


def test_a_request_in_flight_is_never_preempted():
    scheduler = make_scheduler(num_blocks=5, max_model_len=16, pipeline_parallel_size=2)  # 4 usable
    model = FakeModel(4)
    old, new = make_request("old", [1, 2, 3, 4], max_tokens=3), make_request("new", range(10, 21), max_tokens=3)
    scheduler.add_request(old)
    first = scheduler.schedule()
    scheduler.add_request(new)
    second = scheduler.schedule()                 # "new" takes the last 3 blocks, in flight
    (result,) = scheduler.update_from_output(first, model.execute(first))
    third = scheduler.schedule()                  # "old" needs a block: it yields, not "new"
    assert third.req_ids == []
    assert (old.status, new.status) == (RequestStatus.PREEMPTED, RequestStatus.RUNNING)
    scheduler.update_from_output(second, model.execute(second))
    tokens, _ = run_to_completion(scheduler, model)
    assert [result.new_token_ids[0]] + tokens["old"] == reference([1, 2, 3, 4], 3)
    assert new.output_token_ids == reference(range(10, 21), 3)


def test_pipelined_run_matches_the_reference_and_releases_everything():
    scheduler, model = make_scheduler(num_blocks=9, max_model_len=24, max_num_batched_tokens=6,
                                      pipeline_parallel_size=2), FakeModel(4)
    prompts = {f"r{i}": [i + 1] * (3 + 2 * i) for i in range(4)}
    for req_id, prompt in prompts.items():
        scheduler.add_request(make_request(req_id, prompt, max_tokens=9))
    tokens, _ = run_to_completion(scheduler, model)
    assert tokens == {req_id: reference(prompt, 9) for req_id, prompt in prompts.items()}
    assert scheduler.stats().num_preemptions > 0                  # never of a request in flight
    assert scheduler.kv.num_used == 0 and not scheduler.in_flight


def test_abort_in_flight_frees_blocks_when_its_batch_returns():
    scheduler, model = make_scheduler(pipeline_parallel_size=2), FakeModel(4)
    request = make_request("a", range(1, 10))
    scheduler.add_request(request)
    output = scheduler.schedule()
    scheduler.abort_requests(["a"])
    assert request.finish_reason == "abort" and not scheduler.has_unfinished_requests()
    assert scheduler.kv.num_used == 3                              # a worker may still write them
    assert scheduler.update_from_output(output, model.execute(output)) == []
    assert scheduler.kv.num_used == 0 and scheduler.requests == {}


def test_prefix_cache_hits_are_counted_and_skip_computation():
    scheduler, model = make_scheduler(), FakeModel(4)
    shared = list(range(1, 13))
    scheduler.add_request(make_request("first", shared + [50], max_tokens=2))
    run_to_completion(scheduler, model)
    second = make_request("second", shared + [60, 61], max_tokens=2)
    scheduler.add_request(second)
    output, _ = step(scheduler, model)
    assert (output.start_pos, second.num_cached_tokens) == ([12], 12)
    tokens, _ = run_to_completion(scheduler, model)
    assert second.output_token_ids == reference(shared + [60, 61], 2)
    stats = scheduler.stats()
    assert (stats.prefix_cache_queries, stats.prefix_cache_hits) == (13 + 14, 12)
    assert (stats.prompt_tokens, stats.generation_tokens) == (27, 4)


def test_bad_requests_and_settings_are_rejected_with_one_line_errors():
    scheduler = make_scheduler(max_model_len=8)
    with pytest.raises(ValueError, match="longer than --max-model-len"):
        scheduler.add_request(make_request("long", range(9)))
    with pytest.raises(ValueError, match="empty prompt"):
        scheduler.add_request(make_request("empty", []))
    with pytest.raises(ValueError, match="max_tokens"):
        scheduler.add_request(make_request("zero", [1], max_tokens=0))
    scheduler.add_request(make_request("x", [1]))
    with pytest.raises(ValueError, match="already in use"):
        scheduler.add_request(make_request("x", [2]))
    with pytest.raises(ValueError, match="cannot hold one request"):
        make_scheduler(num_blocks=3, max_model_len=16)
    with pytest.raises(ValueError, match="without chunked prefill"):
        make_scheduler(max_model_len=64, enable_chunked_prefill=False)
    assert scheduler.waiting[0].status is RequestStatus.WAITING


def finishing_mix(scheduler):
    """Requests that end every way, with chunked prefills, shared prefixes and preemptions."""
    prompt = [3, 1, 4, 1, 5]
    ref = reference(prompt, 20)
    for i in range(3):
        scheduler.add_request(Request(f"eos{i}", prompt + [i], SamplingParams(temperature=0, max_tokens=20),
                                      (reference(prompt + [i], 20)[2 + i],)))
    scheduler.add_request(make_request("stop_id", prompt, max_tokens=20, stop_token_ids=[ref[3]]))
    scheduler.add_request(make_request("model_len", prompt, max_tokens=40))
    for i in range(4):
        scheduler.add_request(make_request(f"long{i}", list(range(1, 14)) + [i], max_tokens=9))


@pytest.mark.parametrize("batches", [None, 3])
def test_async_scheduling_gives_the_synchronous_tokens(batches):
    """The batch after one in flight computes that batch's token unseen (PENDING_TOKEN);
    what a request gets, and why it ends, is as when every batch waits for the last."""
    results = {}
    for async_scheduling in (False, True):
        scheduler = make_scheduler(num_blocks=12, max_model_len=24, max_num_batched_tokens=7,
                                   async_scheduling=async_scheduling, max_concurrent_batches=batches)
        finishing_mix(scheduler)
        results[async_scheduling] = run_to_completion(scheduler, FakeModel(4))
        assert scheduler.kv.num_used == 0 and scheduler.requests == {} and not scheduler.in_flight
        assert scheduler.stats().num_preemptions > 0
    assert results[True] == results[False]
    tokens, reasons = results[True]
    assert reasons["eos1"] == "stop" and tokens["eos1"] == reference([3, 1, 4, 1, 5, 1], 20)[:4]
    assert reasons["model_len"] == "length" and len(tokens["model_len"]) == 24 - 5


def test_a_request_crosses_to_the_workers_once_then_only_what_changed():
    scheduler, model = make_scheduler(), FakeModel(4)
    scheduler.add_request(make_request("a", [1, 2, 3], max_tokens=3))
    first = scheduler.schedule()                  # the prompt, sampling the first token
    second = scheduler.schedule()                 # that token, before the driver has seen it
    (new,) = first.new_requests
    assert (new.req_id, len(new.block_ids), new.sampling.num_output_tokens) == ("a", 1, 0)
    assert (second.new_requests, second.token_ids, second.start_pos) == ([], [[PENDING_TOKEN]], [3])
    assert second.new_block_ids == [[]]           # position 3 is in the first block
    scheduler.update_from_output(first, model.execute(first))
    output_2 = model.execute(second)
    third = scheduler.schedule()                  # position 4 starts a block
    assert third.token_ids == [[PENDING_TOKEN]] and len(third.new_block_ids[0]) == 1
    scheduler.update_from_output(second, output_2)
    assert scheduler.schedule().req_ids == []     # its last token is in flight: max_tokens
    (result,) = scheduler.update_from_output(third, model.execute(third))
    assert result.finished and scheduler.requests == {}
    scheduler.add_request(make_request("b", [7, 8], max_tokens=1))
    fourth = scheduler.schedule()
    assert fourth.finished_req_ids == ["a"] and scheduler.schedule().finished_req_ids == []
