"""Decode attention with each context split across programs, against one program per KV
head, side by side on one GPU in one run.

    PYTHONPATH=.:benchmarks python benchmarks/gpu_split_attention.py [--json FILE] [--budget-s 120]

(a) the kernel alone at the 8B config's shapes (32 heads, 8 KV heads, head dim 128,
    bf16, blocks of 16): per batch size and context, one CUDA graph of 32 calls (one a
    layer, as the decode graph holds them) built split (the default) and one built
    unsplit (kernels.attention.MAX_SPLITS = 1); GPU us per call, their ratio, and the
    largest difference between the two outputs relative to the output's largest value;
(b) a ModelRunner of the 8B config in this process (dummy bf16 weights, 128 prompt
    tokens, batch 1), its decode graph captured each way: the graph's GPU time as
    captured (its one row at a context of one token: nothing to split, the merge's
    cost alone), the median synchronous execute_model step over rounds that alternate
    the two (contexts of 129 to 288 tokens), and whether 48 greedy steps from the same
    prompt give the same tokens both ways.

Prints a table and writes JSON (default $OUT/gpu_split_attention.json, else ./).
A part that would start past --budget-s is skipped; a part's error is recorded.
"""
from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager

import torch
from gpu_bench import gpu_ms, versions
from gpu_decode import INPUT_LEN, DecodeLoop, Run, budget_options

from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.model.attention import AttentionMetadata
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner
from kernels import attention as attention_kernels

MODEL = "llama-3.1-8b"
HEADS, KV_HEADS, HEAD_DIM, BLOCK_SIZE, LAYERS = 32, 8, 128, 16, 32
KERNEL_CASES = [(batch, context) for batch in (1, 4, 16) for context in (160, 1000, 4000)] + [(32, 1000)]
GREEDY_STEPS, ROUNDS, STEPS_PER_ARM = 48, 10, 8
KV_BLOCKS = 4096     # 65536 tokens of 8B KV cache, 8.6 GB


@contextmanager
def unsplit():
    saved = attention_kernels.MAX_SPLITS
    attention_kernels.MAX_SPLITS = 1
    try:
        yield
    finally:
        attention_kernels.MAX_SPLITS = saved


# -- (a) the kernel alone --------------------------------------------------------------

def decode_inputs(batch: int, context: int, capacity: int):
    """q and a layer's caches for `batch` decodes at `context` tokens each; the metadata tells
    the kernel a graph's capacity as its longest context, as the decode graphs do."""
    blocks = math.ceil((context + 1) / BLOCK_SIZE)
    k_cache = torch.randn(batch * blocks + 1, BLOCK_SIZE, KV_HEADS, HEAD_DIM, dtype=torch.bfloat16,
                          device="cuda")
    tables = torch.randperm(batch * blocks, device="cuda").view(batch, blocks).to(torch.int32)
    meta = AttentionMetadata(
        slot_mapping=torch.zeros(batch, dtype=torch.int64, device="cuda"),
        query_start_loc=torch.arange(batch + 1, dtype=torch.int32, device="cuda"),
        seq_lens=torch.full((batch,), context + 1, dtype=torch.int32, device="cuda"),
        block_tables=tables, max_query_len=1, max_seq_len=capacity)
    q = torch.randn(batch, HEADS, HEAD_DIM, dtype=torch.bfloat16, device="cuda")
    return q, k_cache, torch.randn_like(k_cache), meta


def layers_graph_us(q, k_cache, v_cache, meta) -> tuple[float, torch.Tensor]:
    """GPU us per call of a graph of LAYERS attention calls, and the last call's output."""
    def call():
        return attention_kernels.paged_attention(q, k_cache, v_cache, meta, HEAD_DIM ** -0.5)
    call()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [call() for _ in range(LAYERS)]
    return gpu_ms(graph.replay, repeats=30) * 1e3 / LAYERS, outs[-1]


def kernel_alone() -> list[dict]:
    capacity = 131072    # the 8B config's max positions: what its decode graphs are told
    rows = []
    for batch, context in KERNEL_CASES:
        inputs = decode_inputs(batch, context, capacity)
        splits = attention_kernels.decode_splits(batch, KV_HEADS, 1, capacity,
                                                 attention_kernels.program_target(torch.device("cuda")))
        split_us, split_out = layers_graph_us(*inputs)
        with unsplit():
            unsplit_us, unsplit_out = layers_graph_us(*inputs)
        difference = ((split_out.float() - unsplit_out.float()).abs().max()
                      / unsplit_out.float().abs().max()).item()
        rows.append({"batch": batch, "context": context, "splits": splits, "split_us": split_us,
                     "unsplit_us": unsplit_us, "ratio": split_us / unsplit_us, "max_rel_difference": difference})
        print(f"  batch {batch:>3} context {context:>5}: {splits:>2} splits {split_us:7.1f} us, "
              f"unsplit {unsplit_us:7.1f} us ({split_us / unsplit_us:.2f}x), difference {difference:.1e}",
              flush=True)
        del inputs
    return rows


# -- (b) the 8B runner at batch 1 -----------------------------------------------------

def runner_ab() -> dict:
    steps = GREEDY_STEPS + ROUNDS * 2 * STEPS_PER_ARM + 16
    config = EngineConfig(model=MODEL, max_num_seqs=1, max_model_len=INPUT_LEN + steps + 16, seed=0)
    runner = ModelRunner(resolve_model(MODEL, "dummy"), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    runner.init_kv_cache(KV_BLOCKS)   # the graphs' capacity, as in an engine with its GPU's memory
    runner.warmup()
    graphs = {"split": runner.decode_graphs}
    with unsplit():
        runner.warmup()
    graphs["unsplit"] = runner.decode_graphs
    report = {"graph_us": {name: gpu_ms(g.graphs[1][0].replay) * 1e3 for name, g in graphs.items()}}
    tokens = {}
    for name, g in graphs.items():
        runner.decode_graphs = g
        torch.manual_seed(0)
        loop = DecodeLoop(runner, 1, GREEDY_STEPS + 1)
        for _ in range(GREEDY_STEPS):
            loop._step()
        tokens[name] = loop.tokens[0][INPUT_LEN:]
    report["greedy_equal"] = tokens["split"] == tokens["unsplit"]
    report["first_difference"] = next((i for i, (a, b) in enumerate(zip(*tokens.values())) if a != b), None)
    report["step_us"] = alternating_steps(runner, graphs, steps)
    report["step_ratio"] = report["step_us"]["split"] / report["step_us"]["unsplit"]
    print(f"  graph {report['graph_us']}, step {report['step_us']}, greedy equal {report['greedy_equal']}",
          flush=True)
    del runner, graphs
    return report


def alternating_steps(runner: ModelRunner, graphs: dict, steps: int) -> dict:
    """Median synchronous step per arm, over rounds that alternate which arm goes first."""
    loop = DecodeLoop(runner, 1, steps)
    times = {name: [] for name in graphs}
    names = list(graphs)
    for round_ in range(ROUNDS):
        for name in names[round_ % 2:] + names[:round_ % 2]:
            runner.decode_graphs = graphs[name]
            for _ in range(STEPS_PER_ARM):
                start = time.perf_counter()
                loop._step()
                torch.cuda.synchronize()
                times[name].append((time.perf_counter() - start) * 1e6)
    return {name: statistics.median(values) for name, values in times.items()}


def print_table(report: dict) -> None:
    rows = report.get("kernel_alone") or []
    print(f"\n{'batch':>5} {'context':>7} {'splits':>6} {'split us':>9} {'unsplit us':>10} {'ratio':>6}")
    for row in rows:
        print(f"{row['batch']:>5} {row['context']:>7} {row['splits']:>6} {row['split_us']:>9.1f} "
              f"{row['unsplit_us']:>10.1f} {row['ratio']:>6.2f}")
    runner = report.get("runner_8b_batch1")
    if runner:
        print(f"\n8B batch 1: graph {runner['graph_us']['split']:.0f} / {runner['graph_us']['unsplit']:.0f} us, "
              f"step {runner['step_us']['split']:.0f} / {runner['step_us']['unsplit']:.0f} us "
              f"(split / unsplit, {runner['step_ratio']:.3f}), greedy equal: {runner['greedy_equal']}")


def main() -> None:
    run = Run.of(budget_options(__doc__, "gpu_split_attention", 120).parse_args(), "gpu_split_attention")
    run.part("versions", versions, needs_s=0)
    run.part("kernel_alone", kernel_alone, needs_s=10)
    run.part("runner_8b_batch1", runner_ab, needs_s=40)
    print_table(run.report)
    print(f"wrote {run.path}", flush=True)


if __name__ == "__main__":
    main()
