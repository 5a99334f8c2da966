"""One rank's model execution: SchedulerOutput -> input tensors -> model -> sampled tokens.

The runner keeps each request's block table and sampling state from the step it
arrives in (`new_requests`) until the driver drops it, and applies each step's
additions. At pp=1 every rank samples (all TP ranks hold the same logits and
draw the same tokens), so that a step the driver scheduled before it saw the
previous step's tokens finds them here (PENDING_TOKEN): each request keeps a
reference to the tensor its last token was sampled into, and a PENDING_TOKEN is
gathered from there on the device, without waiting for the step that samples it.

On GPU, a step in which every request computes one token (a decode batch) replays a
CUDA graph of this stage's forward, captured at warmup for its padded batch size; any
other step runs eagerly. PP send/recv, the LM head, sampling and the probe's phases
stay outside the graphs.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import torch

from diagnose import probe
from diagnose.core.vocab import Phase
from engine.communicator import Communicator
from engine.config import EngineConfig
from engine.model.attention import AttentionMetadata
from engine.model.device_copy import to_device
from engine.model.linear import pack_linears
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import ModelSource, load_weights
from engine.model.sampler import Sampler
from engine.scheduler_output import PENDING_TOKEN, ModelRunnerOutput, RequestSampling, SchedulerOutput
from engine.worker.cuda_graphs import DecodeGraphs
from engine.worker.model_inputs import ModelInputs


@dataclass
class RequestState:
    block_ids: list[int]
    sampling: RequestSampling
    sampled_into: tuple[torch.Tensor, int] | None = None  # (tokens, row) of its last sampled token


@dataclass
class SampledStep:
    """A step's sampled tokens on their way to the host: on a GPU the copy is queued
    behind the step's work and `done` marks its end, so the caller may launch the next
    step before it waits for this one."""
    step: int
    tokens: torch.Tensor                  # on the host (pinned memory on a GPU)
    done: torch.cuda.Event | None = None  # None: already there

    def output(self) -> ModelRunnerOutput:
        if self.done is not None:
            self.done.synchronize()
        return ModelRunnerOutput(self.step, self.tokens.tolist())


class ModelRunner:
    def __init__(self, source: ModelSource, comm: Communicator, dtype: torch.dtype,
                 device: torch.device, config: EngineConfig):
        self.comm = comm
        self.dtype = dtype
        self.device = device
        self.block_size = config.block_size
        self.max_num_seqs = config.max_num_seqs
        self.use_cuda_graphs = device.type == "cuda" and not config.enforce_eager
        self.model = LlamaForCausalLM(source.model_config, comm, dtype, device)
        load_weights(self.model, source, config.seed)
        pack_linears(self.model)
        self.sampler = Sampler(config.seed)
        self.requests: dict[str, RequestState] = {}
        self.samples = comm.tp_rank == 0 or comm.pp_size == 1
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.num_blocks = 0
        self.decode_graphs: DecodeGraphs | None = None

    def kv_bytes_per_block(self) -> int:
        shape = self.model.kv_cache_shape(1, self.block_size)
        per_tensor = torch.Size(shape).numel() * torch.empty(0, dtype=self.dtype).element_size()
        return 2 * per_tensor * len(self.model.layers)

    def init_kv_cache(self, num_blocks: int) -> None:
        """num_blocks for the scheduler's requests, and one more, block `num_blocks`, that
        no request owns: the padding rows of a decode graph write there."""
        self.num_blocks = num_blocks
        shape = self.model.kv_cache_shape(num_blocks + 1, self.block_size)
        self.kv_caches = [
            (torch.zeros(shape, dtype=self.dtype, device=self.device),
             torch.zeros(shape, dtype=self.dtype, device=self.device))
            for _ in range(len(self.model.layers))
        ]

    @torch.inference_mode()
    def warmup(self) -> None:
        if self.device.type != "cuda":
            return
        if self.use_cuda_graphs:
            # No request holds more blocks than the pool has, or than its positions need.
            max_positions = self.model.config.max_position_embeddings
            max_blocks_per_seq = min(self.num_blocks, -(-max_positions // self.block_size))
            self.decode_graphs = DecodeGraphs(self.model, self.kv_caches, self.max_num_seqs,
                                              max_blocks_per_seq, pad_block=self.num_blocks)
        torch.cuda.synchronize()

    def update_requests(self, out: SchedulerOutput) -> list[RequestState]:
        """Apply the step's changes to the requests held; returns the batch's, in row order."""
        for req_id in out.finished_req_ids:
            del self.requests[req_id]
        for new in out.new_requests:  # copies: the runner changes them, its caller may not
            self.requests[new.req_id] = RequestState(list(new.block_ids), replace(new.sampling))
        batch = [self.requests[req_id] for req_id in out.req_ids]
        for state, new_blocks in zip(batch, out.new_block_ids):
            state.block_ids += new_blocks
        return batch

    def prepare_inputs(self, out: SchedulerOutput, batch: list[RequestState]) -> ModelInputs:
        ids, positions, slots, qsl, seq_lens, sample_rows = [], [], [], [0], [], []
        pending: list[tuple[int, tuple[torch.Tensor, int]]] = []  # (input row, where its token is)
        for state, start, tokens, sample in zip(batch, out.start_pos, out.token_ids, out.sample):
            n = len(tokens)
            ids.extend(tokens)
            if tokens[-1] == PENDING_TOKEN:  # only a step's last token can be one
                pending.append((len(ids) - 1, state.sampled_into))
            pos = range(start, start + n)
            positions.extend(pos)
            blocks = state.block_ids
            slots.extend(blocks[p // self.block_size] * self.block_size + p % self.block_size for p in pos)
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
            if sample:
                sample_rows.append(qsl[-1] - 1)
        width = max(len(state.block_ids) for state in batch)
        tables = [b for state in batch for b in state.block_ids + [0] * (width - len(state.block_ids))]
        sources, source_rows = _gather_plan([where for _, where in pending])
        ids, positions, slots, sample_rows, pending_rows, source_rows = self._to_device(
            [ids, positions, slots, sample_rows, [row for row, _ in pending], source_rows],
            torch.int64)
        if pending:
            ids[pending_rows] = sources[source_rows]
        max_seq_len = max(seq_lens)
        qsl, seq_lens, tables = self._to_device([qsl, seq_lens, tables], torch.int32)
        meta = AttentionMetadata(
            slot_mapping=slots,
            query_start_loc=qsl,
            seq_lens=seq_lens,
            block_tables=tables.view(len(batch), width),
            max_query_len=max(len(tokens) for tokens in out.token_ids),
            max_seq_len=max_seq_len,
        )
        return ModelInputs(ids, positions, meta, sample_rows)

    def _to_device(self, lists: list[list[int]], dtype: torch.dtype) -> list[torch.Tensor]:
        """One host-to-device copy for several lists of ints; a view of each."""
        flat = to_device(list(itertools.chain.from_iterable(lists)), dtype, self.device)
        return list(flat.split([len(x) for x in lists]))

    @torch.inference_mode()
    def execute_model(self, out: SchedulerOutput) -> SampledStep | None:
        batch = self.update_requests(out)
        inputs = self.prepare_inputs(out, batch)
        hidden = residual = None
        if not self.comm.is_first_stage:
            with probe.phase(Phase.PP_RECV, step=out.step):
                shape = (len(inputs.input_ids), self.model.config.hidden_size)
                hidden, residual = self.comm.recv([(shape, self.dtype)] * 2,
                                                  self.comm.prev_stage_rank(), self.device)
        with probe.phase(Phase.FORWARD, step=out.step):
            hidden, residual = self._forward(inputs, hidden, residual)
        if not self.comm.is_last_stage:
            with probe.phase(Phase.PP_SEND, step=out.step):
                self.comm.send([hidden, residual], self.comm.next_stage_rank())
            return None
        return self._sample(out, batch, hidden[inputs.sample_rows])

    def _forward(self, inputs: ModelInputs, hidden, residual):
        if self.decode_graphs is not None and self.decode_graphs.fits(inputs):
            return self.decode_graphs.replay(inputs, hidden, residual)
        return self.model(inputs.input_ids, inputs.positions, hidden, residual, inputs.meta,
                          self.kv_caches)

    def _sample(self, out: SchedulerOutput, batch: list[RequestState],
                hidden: torch.Tensor) -> SampledStep | None:
        logits = self.model.compute_logits(hidden)
        if not self.samples:
            return None
        with probe.phase(Phase.SAMPLE, step=out.step):
            sampled = [state for state, sample in zip(batch, out.sample) if sample]
            tokens = self.sampler.sample(logits, [state.sampling for state in sampled])
        for row, state in enumerate(sampled):
            state.sampled_into = (tokens, row)
            state.sampling.num_output_tokens += 1
        return self._to_host(out.step, tokens) if self.comm.tp_rank == 0 else None

    def _to_host(self, step: int, tokens: torch.Tensor) -> SampledStep:
        if tokens.device.type != "cuda":
            return SampledStep(step, tokens)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return SampledStep(step, host, done)


def _gather_plan(sources: list[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor | None, list[int]]:
    """The tensors the given (tokens, row) pairs point into, as one, and each pair's row in
    it. Usually they all point into the previous step's tokens."""
    parts, offsets, rows = [], {}, []     # offsets: id of a tensor -> where it starts in the whole
    for tokens, row in sources:
        if id(tokens) not in offsets:
            offsets[id(tokens)] = sum(len(part) for part in parts)
            parts.append(tokens)
        rows.append(offsets[id(tokens)] + row)
    if len(parts) > 1:
        return torch.cat(parts), rows
    return (parts[0] if parts else None), rows
