"""The whole engine with real worker processes and gloo: tp/pp layouts agree,
scheduler features do not change greedy output, a dead worker is an error."""
import json
import os
import signal
import subprocess
import sys
import threading
import time

import psutil
import pytest

from engine.entrypoints.llm import LLM
from engine.executor.executor import WorkerDiedError
from engine.sampling_params import SamplingParams

PROMPTS = ["Hello, my name is", "The capital of France is a city that",
           "1 2 3", "A long prompt " * 12]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def _shm_segments() -> set[str]:
    return {n for n in os.listdir("/dev/shm") if n.startswith("psm_")}


def _generate(**kwargs) -> list[list[int]]:
    with LLM("tiny-llama", **kwargs) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def reference() -> list[list[int]]:
    return _generate()


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2), (2, 2), (2, 4)])
def test_parallel_layouts_match_single_rank(reference, tp, pp):
    assert _generate(tensor_parallel_size=tp, pipeline_parallel_size=pp) == reference


def test_pp_without_batch_queue_matches(reference):
    assert _generate(pipeline_parallel_size=2, max_concurrent_batches=1) == reference


def test_async_scheduling_matches_the_synchronous_path(reference):
    """With async scheduling a step computes the token the step before it sampled before
    the driver has seen it (and samples once more for a request that stops there): the
    greedy and the seeded tokens are those of the synchronous path."""
    seeded = SamplingParams(temperature=1.0, seed=3, max_tokens=12)

    def run(**kwargs):
        with LLM("tiny-llama", **kwargs) as llm:
            return [[o.token_ids for o in llm.generate(PROMPTS, params)] for params in (GREEDY, seeded)]

    synchronous = run(async_scheduling=False)
    assert synchronous == run() and synchronous[0] == reference


def test_chunked_prefill_and_prefix_cache_do_not_change_output(reference):
    assert _generate(max_num_batched_tokens=8) == reference
    assert _generate(enable_chunked_prefill=False, max_model_len=256,
                     max_num_batched_tokens=256) == reference
    with LLM("tiny-llama") as llm:  # second round hits the prefix cache
        first = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        second = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
        assert llm.engine.core.scheduler.stats().prefix_cache_hits > 0
    assert first == second == reference


def test_preemption_under_tiny_kv_budget_keeps_output():
    prompts = [f"Story {i}: once upon a time, in a land far away," for i in range(6)]
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    with LLM("tiny-llama") as llm:
        roomy = [o.token_ids for o in llm.generate(prompts, params)]
    with LLM("tiny-llama", num_gpu_blocks_override=14, max_model_len=200) as llm:
        tight = [o.token_ids for o in llm.generate(prompts, params)]
        assert llm.engine.core.scheduler.stats().num_preemptions > 0
    assert tight == roomy


def test_killed_worker_is_named_and_nothing_is_left(reference):
    before = _shm_segments()
    llm = LLM("tiny-llama", tensor_parallel_size=2, pipeline_parallel_size=2)
    workers = [psutil.Process(p.pid) for p in llm.engine.core.executor.procs]
    victim = workers[3]
    params = SamplingParams(temperature=0.0, max_tokens=10_000, ignore_eos=True)
    threading.Timer(1.0, os.kill, (victim.pid, signal.SIGKILL)).start()
    started = time.monotonic()
    with pytest.raises(WorkerDiedError, match=r"rank 3 \(pp 1/2, tp 1\) was killed by signal SIGKILL"):
        try:
            llm.generate(PROMPTS, params)
        finally:
            llm.shutdown()
    assert time.monotonic() - started < 10
    assert not [p for p in workers if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert _shm_segments() <= before


def test_bad_offline_requests_fail_alone(reference):
    with LLM("tiny-llama") as llm:
        for prompt, params, message in [
                ([1, 10**9], GREEDY, r"prompt token ids must be in \[0, "),
                ("hi", SamplingParams(top_k=2**70), "top_k"),
                ("hi", SamplingParams(temperature=float("nan")), "temperature")]:
            with pytest.raises(ValueError, match=message):
                llm.generate([prompt], params)
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY)] == reference


@pytest.mark.parametrize("argv,message", [
    (["--model", "no-such-model"], "no-such-model"),
    (["--model", "/nonexistent/model.gguf"], "/nonexistent/model.gguf"),
    (["--model", "smollm2-135m", "-tp", "2"], "1, 3"),
    (["--prompt", ""], "empty"),
    (["--max-tokens", "0"], "max_tokens"),
    (["--top-k", str(2**70)], "top_k"),
    (["--temperature", "nan"], "temperature"),
    (["--temperature", "inf"], "temperature"),
    (["--top-p", "0"], "top_p"),
    (["--request-seed", str(2**64)], "seed"),
])
def test_bad_input_is_one_line_error(argv, message):
    cmd = [sys.executable, "-m", "engine", "generate", "--prompt", "hi", *argv]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_generate_cli_json():
    cmd = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
           "--prompt", PROMPTS[0], "--prompt", PROMPTS[2], "--max-tokens", "12",
           "--ignore-eos", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in proc.stdout.splitlines()]
    assert [r["prompt"] for r in rows] == [PROMPTS[0], PROMPTS[2]]
    assert all(len(r["token_ids"]) == 12 and isinstance(r["text"], str) for r in rows)
