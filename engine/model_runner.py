"""One rank's model execution: SchedulerOutput -> input tensors -> model -> sampled tokens."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from diagnose import probe
from engine.attention import AttentionMetadata
from engine.communicator import Communicator
from engine.loader import ModelSource, load_weights
from engine.model import LlamaForCausalLM
from engine.sampler import Sampler
from engine.scheduler_output import ModelRunnerOutput, SchedulerOutput


@dataclass
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # row of each sampled request's last token


class ModelRunner:
    def __init__(self, source: ModelSource, comm: Communicator, dtype: torch.dtype,
                 device: torch.device, block_size: int, seed: int):
        self.comm = comm
        self.dtype = dtype
        self.device = device
        self.block_size = block_size
        self.model = LlamaForCausalLM(source.model_config, comm, dtype, device)
        load_weights(self.model, source, seed)
        self.sampler = Sampler(seed)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []

    def kv_bytes_per_block(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        per_tensor = torch.Size(shape).numel() * torch.empty(0, dtype=self.dtype).element_size()
        return 2 * per_tensor * len(self.model.layers)

    def init_kv_cache(self, num_blocks: int) -> None:
        shape = self.model.kv_cache_shape(num_blocks, self.block_size)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(len(self.model.layers))
        ]

    def prepare_inputs(self, out: SchedulerOutput) -> ModelInputs:
        ids, positions, slots, qsl, seq_lens, sample_rows = [], [], [], [0], [], []
        for req in out.requests:
            n = len(req.token_ids)
            ids.extend(req.token_ids)
            pos = range(req.start_pos, req.start_pos + n)
            positions.extend(pos)
            slots.extend(req.block_ids[p // self.block_size] * self.block_size + p % self.block_size
                         for p in pos)
            qsl.append(qsl[-1] + n)
            seq_lens.append(req.start_pos + n)
            if req.sample:
                sample_rows.append(qsl[-1] - 1)
        width = max(len(r.block_ids) for r in out.requests)
        tables = [r.block_ids + [0] * (width - len(r.block_ids)) for r in out.requests]
        as_tensor = lambda x, dt: torch.tensor(x, dtype=dt, device=self.device)  # noqa: E731
        meta = AttentionMetadata(
            slot_mapping=as_tensor(slots, torch.int64),
            query_start_loc=as_tensor(qsl, torch.int32),
            seq_lens=as_tensor(seq_lens, torch.int32),
            block_tables=as_tensor(tables, torch.int32),
            max_query_len=max(len(r.token_ids) for r in out.requests),
            max_seq_len=max(seq_lens),
        )
        return ModelInputs(as_tensor(ids, torch.int64), as_tensor(positions, torch.int64),
                           meta, as_tensor(sample_rows, torch.int64))

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> ModelRunnerOutput | None:
        inputs = self.prepare_inputs(out)
        hidden = residual = None
        if not self.comm.is_first_stage:
            with probe.phase("pp_recv", step=out.step):
                shape = (len(inputs.input_ids), self.model.config.hidden_size)
                hidden, residual = self.comm.recv([(shape, self.dtype)] * 2,
                                                  self.comm.prev_stage_rank(), self.device)
        with probe.phase("forward", step=out.step):
            hidden, residual = self.model(inputs.input_ids, inputs.positions, hidden, residual,
                                          inputs.meta, self.kv_caches)
        if not self.comm.is_last_stage:
            with probe.phase("pp_send", step=out.step):
                self.comm.send([hidden, residual], self.comm.next_stage_rank())
            return None
        return self._sample(out, hidden[inputs.sample_rows])

    def _sample(self, out: SchedulerOutput, hidden: torch.Tensor) -> ModelRunnerOutput | None:
        logits = self.model.compute_logits(hidden)
        if self.comm.tp_rank != 0:
            return None
        with probe.phase("sample", step=out.step):
            sampled = [r for r in out.requests if r.sample]
            tokens = self.sampler.sample(logits, sampled)
        return ModelRunnerOutput(out.step, [r.req_id for r in sampled], tokens)
