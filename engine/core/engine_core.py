"""EngineCore.step(): schedule -> execute_model -> update_from_output.

The core keeps up to `batch_queue_size` batches in flight, as vLLM's batch
queue does: with pipeline parallelism so that every stage has work, and with
async scheduling at pp=1 (two batches) so that the workers find the next batch
waiting when they finish one. The driver's work for a step (update_from_output,
the caller's detokenizing and replies, scheduling the next batch) then runs
while the workers compute the step after it, not between two steps.
"""
from __future__ import annotations

import math
from collections import deque

import torch

from diagnose import probe
from diagnose.core.vocab import Phase, Role
from engine.config import EngineConfig
from engine.core.scheduler import Scheduler
from engine.executor.executor import Executor
from engine.model.config import ModelConfig
from engine.scheduler_output import SchedulerOutput

CPU_KV_CACHE_BYTES = 1 << 30


def resolve_device(config: EngineConfig) -> tuple[str, torch.dtype]:
    device = config.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if config.dtype != "auto":
        return device, getattr(torch, config.dtype)
    return device, torch.bfloat16 if device == "cuda" else torch.float32


class EngineCore:
    def __init__(self, config: EngineConfig, model_config: ModelConfig, max_model_len: int):
        probe.init(Role.DRIVER)
        device, dtype = resolve_device(config)
        self.config = config
        self.executor = Executor(config, device, dtype)
        try:
            num_blocks = self._init_kv_cache(max_model_len)
            self.executor.collective_rpc("warmup")
        except BaseException:
            self.executor.shutdown()
            raise
        self.num_blocks = num_blocks
        self.scheduler = Scheduler(config, num_blocks, max_model_len)
        self.in_flight: deque[SchedulerOutput] = deque()

    def _init_kv_cache(self, max_model_len: int) -> int:
        config = self.config
        per_block = max(self.executor.collective_rpc("kv_bytes_per_block"))
        if config.num_gpu_blocks_override:
            num_blocks = config.num_gpu_blocks_override
        else:
            free = [f for f in self.executor.collective_rpc("free_memory_bytes") if f is not None]
            budget = config.kv_cache_memory_bytes or (
                int(min(free) * config.gpu_memory_utilization) if free else CPU_KV_CACHE_BYTES)
            enough = config.max_num_seqs * math.ceil(max_model_len / config.block_size) + 1
            num_blocks = min(budget // per_block, enough)
        if num_blocks < 2:
            raise ValueError(f"the KV cache budget holds only {num_blocks} blocks; "
                             "raise --kv-cache-memory-bytes or --num-gpu-blocks-override")
        self.executor.collective_rpc("init_kv_cache", (num_blocks,))
        return num_blocks

    def step(self):
        """One engine step; returns the per-request outputs it produced."""
        if self.config.batch_queue_size == 1:
            return self._step_in_order()
        return self._step_with_batch_queue()

    def _schedule(self) -> SchedulerOutput | None:
        with probe.phase(Phase.SCHEDULE, step=self.scheduler.next_step):
            out = self.scheduler.schedule()
        return out if out.req_ids else None

    def _finish(self, out: SchedulerOutput, result):
        with probe.phase(Phase.UPDATE_FROM_OUTPUT, step=out.step):
            return self.scheduler.update_from_output(out, result)

    def _step_in_order(self):
        out = self._schedule()
        if out is None:
            return []
        with probe.phase(Phase.EXECUTE_MODEL, step=out.step):
            result = self.executor.execute_model(out)
        return self._finish(out, result)

    def _step_with_batch_queue(self):
        if len(self.in_flight) < self.config.batch_queue_size:
            out = self._schedule()
            if out is not None:
                self.executor.submit("execute_model", (out,), self.executor.output_rank)
                self.in_flight.append(out)
                if len(self.in_flight) < self.config.batch_queue_size:
                    return []
        if not self.in_flight:
            return []
        out = self.in_flight.popleft()
        with probe.phase(Phase.EXECUTE_MODEL, step=out.step):
            result = self.executor.wait_reply(self.executor.output_rank)
        return self._finish(out, result)

    def add_request(self, request) -> None:
        self.scheduler.add_request(request)

    def abort_requests(self, req_ids) -> None:
        self.scheduler.abort_requests(req_ids)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_unfinished_requests() or bool(self.in_flight)

    def shutdown(self) -> None:
        self.executor.shutdown()
