"""DecodeGraphs: CUDA graphs of one stage's forward over decode batches, captured at warmup.

A step in which every request computes one token replays the graph of its padded
batch size; any other step runs eagerly (model_runner.py). PP send/recv, the LM
head, sampling and the probe's phases stay outside the graphs; the captured TP
all-reduces are recorded by the probe again at every replay.
"""
from __future__ import annotations

import bisect

import torch

from diagnose import probe
from diagnose.core import progress
from engine.model.attention import AttentionMetadata
from engine.model.llama import LlamaForCausalLM
from engine.worker.model_inputs import ModelInputs


def capture_sizes(max_batch: int) -> list[int]:
    """The padded batch sizes that get a graph: powers of two, then max_batch."""
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return sizes + [max_batch]


class DecodeGraphs:
    """CUDA graphs of the model's forward over decode batches, one per padded batch size.

    The graphs read static buffers. A step copies its requests into the first rows; the
    padding rows compute one token each at the padding block's slot 0, and their output
    rows are dropped. Captured TP all-reduces replay on NCCL like any other kernel; the
    probe records them again at every replay."""

    def __init__(self, model: LlamaForCausalLM, kv_caches, max_batch: int,
                 max_blocks_per_seq: int, pad_block: int):
        self.model = model
        self.kv_caches = kv_caches
        self.sizes = capture_sizes(max_batch)
        self.pad_block = pad_block
        self.pad_slot = pad_block * kv_caches[0][0].shape[1]
        device = kv_caches[0][0].device
        rows = self.sizes[-1]
        self.input_ids = torch.zeros(rows, dtype=torch.int64, device=device)
        self.positions = torch.zeros(rows, dtype=torch.int64, device=device)
        self.slot_mapping = torch.full((rows,), self.pad_slot, dtype=torch.int64, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(rows, dtype=torch.int32, device=device)
        self.block_tables = torch.full((rows, max_blocks_per_seq), pad_block, dtype=torch.int32,
                                       device=device)
        self.hidden = self.residual = None
        if model.embed_tokens is None:  # a later PP stage: the previous stage's output comes in
            shape, dtype = (rows, model.config.hidden_size), kv_caches[0][0].dtype
            self.hidden = torch.zeros(shape, dtype=dtype, device=device)
            self.residual = torch.zeros(shape, dtype=dtype, device=device)
        self.graphs: dict[int, tuple] = {}  # size -> (graph, outputs, the probe's capture)
        self._capture()

    def _capture(self) -> None:
        """Largest first, so the smaller graphs reuse its memory pool."""
        pool = torch.cuda.graph_pool_handle()
        for size in progress.track(self.sizes[::-1], "capturing CUDA graphs", "batch sizes",
                                   "batch size {}".format):
            self._run_model(size)  # eagerly first: compiles this shape's kernels, inits NCCL
            graph = torch.cuda.CUDAGraph()
            with probe.graph_capture() as captured, torch.cuda.graph(graph, pool=pool):
                outputs = self._run_model(size)
            self.graphs[size] = (graph, outputs, captured)

    def _run_model(self, size: int):
        meta = AttentionMetadata(
            slot_mapping=self.slot_mapping[:size],
            query_start_loc=self.query_start_loc[:size + 1],
            seq_lens=self.seq_lens[:size],
            block_tables=self.block_tables[:size],
            max_query_len=1,
            # The captured kernels must serve any context: the longest a block table holds.
            max_seq_len=self.block_tables.shape[1] * self.kv_caches[0][0].shape[1],
        )
        hidden = residual = None
        if self.hidden is not None:
            hidden, residual = self.hidden[:size], self.residual[:size]
        return self.model(self.input_ids[:size], self.positions[:size], hidden, residual, meta,
                          self.kv_caches)

    def fits(self, inputs: ModelInputs) -> bool:
        return inputs.meta.max_query_len == 1 and len(inputs.meta.seq_lens) <= self.sizes[-1]

    def replay(self, inputs: ModelInputs, hidden, residual):
        num_seqs = len(inputs.meta.seq_lens)
        size = self.sizes[bisect.bisect_left(self.sizes, num_seqs)]
        meta, real, pad = inputs.meta, slice(0, num_seqs), slice(num_seqs, size)
        self.input_ids[real].copy_(inputs.input_ids)
        self.positions[real].copy_(inputs.positions)
        self.slot_mapping[real].copy_(meta.slot_mapping)
        self.slot_mapping[pad].fill_(self.pad_slot)
        self.seq_lens[real].copy_(meta.seq_lens)
        self.seq_lens[pad].fill_(1)
        self.block_tables[real, :meta.block_tables.shape[1]].copy_(meta.block_tables)
        self.block_tables[pad, 0].fill_(self.pad_block)
        if self.hidden is not None:
            self.hidden[real].copy_(hidden)
            self.residual[real].copy_(residual)
        graph, (out_hidden, out_residual), captured = self.graphs[size]
        with probe.graph_replay(captured):
            graph.replay()
        return out_hidden[real], None if out_residual is None else out_residual[real]
