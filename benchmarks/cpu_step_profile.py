"""Where an engine step's time goes on the CPU: the driver's parts and the worker's.

    python benchmarks/cpu_step_profile.py [--model DIR] [--dtype bfloat16] [--batch 16]
        [-o benchmarks/results/cpu_step_profile.json]

The shape is cpu_vs_vllm.py's: `--batch` requests of 128 prompt tokens decoding
together, on the tiny Llama checkpoint (tests/vllm_env/make_tiny_llama.py) unless
--model names another. Two parts, each on one core, CPU time per decode step
(median over the steps):

- driver: a real LLMEngine (one worker process, async scheduling off so that the
  parts follow each other) with its own functions timed: scheduling, the
  broadcast (pickling into the shared-memory ring), the wait for the reply (the
  worker's whole step, wall time), update_from_output and detokenizing;
- worker: a ModelRunner in this process at the same shape, its parts timed: the
  batch's inputs, the layers' attention, the rest of the layers, the LM head,
  sampling; and the ring's read and unpickling of the step's message.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.vllm_serving import make_checkpoint  # noqa: E402

from engine.communicator import Communicator, Layout  # noqa: E402
from engine.config import EngineConfig  # noqa: E402
from engine.core import llm_engine, scheduler  # noqa: E402
from engine.executor import executor  # noqa: E402
from engine.model import attention  # noqa: E402
from engine.model.loader import resolve_model  # noqa: E402
from engine.sampling_params import SamplingParams  # noqa: E402
from engine.scheduler_output import (PENDING_TOKEN, NewRequest, RequestSampling,  # noqa: E402
                                     SchedulerOutput)
from engine.worker.model_runner import ModelRunner  # noqa: E402
from engine.worker.shm_ring import ShmRing  # noqa: E402

PROMPT_LEN, DECODE_STEPS = 128, 48


class Clock:
    """CPU (or wall) seconds spent in each wrapped function, summed per step."""

    def __init__(self):
        self.steps: list[dict[str, float]] = []
        self.current: dict[str, float] = defaultdict(float)

    @contextmanager
    def timing(self, name: str, wall: bool = False):
        now = time.perf_counter if wall else time.thread_time
        start = now()
        try:
            yield
        finally:
            self.current[name] += now() - start

    def wrap(self, owner, attr: str, name: str, wall: bool = False):
        inner = getattr(owner, attr)

        def timed(*args, **kwargs):
            with self.timing(name, wall):
                return inner(*args, **kwargs)
        setattr(owner, attr, timed)

    def end_step(self) -> None:
        self.steps.append(self.current)
        self.current = defaultdict(float)

    def median_ms(self, skip: int) -> dict[str, float]:
        names = {name: None for step in self.steps for name in step}
        return {name: statistics.median(step.get(name, 0.0) for step in self.steps[skip:]) * 1e3
                for name in names}


def driver_part(model: str, dtype: str, batch: int) -> dict[str, float]:
    clock = Clock()
    clock.wrap(scheduler.Scheduler, "schedule", "driver: schedule")
    clock.wrap(executor.Executor, "submit", "driver: broadcast (pickle, ring write)")
    clock.wrap(executor.Executor, "wait_reply", "driver: wait for the reply (wall)", wall=True)
    clock.wrap(scheduler.Scheduler, "update_from_output", "driver: update_from_output")
    clock.wrap(llm_engine.LLMEngine, "_update", "driver: detokenize")
    clock.wrap(llm_engine.LLMEngine, "step", "driver: whole step (wall)", wall=True)
    engine = llm_engine.LLMEngine(EngineConfig(model=model, dtype=dtype, async_scheduling=False,
                                               max_num_seqs=batch))
    try:
        generator = torch.Generator().manual_seed(0)
        vocab = engine.model_config.vocab_size
        params = SamplingParams(temperature=1.0, max_tokens=DECODE_STEPS, ignore_eos=True)
        for _ in range(2):                       # the first round warms up
            clock.steps.clear()
            for prompt in torch.randint(0, vocab, (batch, PROMPT_LEN), generator=generator).tolist():
                engine.add_request(prompt, params)
            while engine.has_unfinished_requests():
                engine.step()
                clock.end_step()
    finally:
        engine.shutdown()
    return clock.median_ms(skip=PROMPT_LEN * batch // EngineConfig.max_num_batched_tokens + 1)


def worker_part(model: str, dtype: str, batch: int) -> dict[str, float]:
    config = EngineConfig(model=model, max_num_seqs=batch)
    runner = ModelRunner(resolve_model(model), Communicator(Layout(1, 1), 0), getattr(torch, dtype),
                         torch.device("cpu"), config)
    blocks_per_request = -(-(PROMPT_LEN + DECODE_STEPS + 1) // config.block_size)
    runner.init_kv_cache(batch * blocks_per_request + 1)
    clock = Clock()
    clock.wrap(attention, "paged_attention", "worker: attention")
    clock.wrap(runner, "update_requests", "worker: the batch's requests")
    clock.wrap(runner, "prepare_inputs", "worker: the batch's input tensors")
    clock.wrap(runner.model, "compute_logits", "worker: LM head")
    clock.wrap(runner.sampler, "sample", "worker: sampling")
    clock.wrap(runner, "_forward", "worker: layers (all)")
    req_ids = [f"r{b}" for b in range(batch)]
    sampling = [RequestSampling(1.0, 0, 1.0, None, 0) for _ in req_ids]
    prompt = SchedulerOutput(0, req_ids, [0] * batch, [[5] * PROMPT_LEN] * batch, [True] * batch,
                             [[] for _ in req_ids], [
                                 NewRequest(r, list(range(1 + b * blocks_per_request, 1 + (b + 1) * blocks_per_request)), s)
                                 for b, (r, s) in enumerate(zip(req_ids, sampling))])
    runner.execute_model(prompt)
    ring = ShmRing.create(n_readers=1)
    try:
        for step in range(1, DECODE_STEPS):
            out = SchedulerOutput(step, req_ids, [PROMPT_LEN + step - 1] * batch, [[PENDING_TOKEN]] * batch,
                                  [True] * batch, [[] for _ in req_ids])
            ring.enqueue(("execute_model", (out,), 0))
            with clock.timing("worker: ring read, unpickle"):
                ring.dequeue(0)
            with clock.timing("worker: whole step"):
                runner.execute_model(out)
            clock.end_step()
    finally:
        ring.release()
    medians = clock.median_ms(skip=4)
    medians["worker: layers (all)"] -= medians["worker: attention"]
    medians["worker: layers, not attention"] = medians.pop("worker: layers (all)")
    parts = [k for k in medians if k != "worker: whole step"]
    medians["worker: the rest (Python between the parts)"] = medians["worker: whole step"] - sum(
        medians[k] for k in parts if k != "worker: ring read, unpickle")
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="HF directory (default: the tiny Llama, made here)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("-o", "--output", default="benchmarks/results/cpu_step_profile.json")
    args = parser.parse_args()
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    torch.set_num_threads(1)
    model = args.model or str(make_checkpoint(Path(tempfile.mkdtemp(prefix="cpu-profile-")) / "tiny-llama"))
    rows = {**worker_part(model, args.dtype, args.batch), **driver_part(model, args.dtype, args.batch)}
    width = max(map(len, rows))
    print(f"decode step, {args.batch} requests of {PROMPT_LEN} prompt tokens, {args.dtype}, ms per step:")
    for name, ms in rows.items():
        print(f"  {name:<{width}}  {ms:7.3f}")
    Path(args.output).write_text(json.dumps(
        {"args": vars(args), "machine": platform.platform(), "ms_per_step": rows}, indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
