"""Batch-1 products: kernels/gemv.py against cuBLAS, side by side on one GPU in one run.

    PYTHONPATH=.:benchmarks python benchmarks/gpu_gemv.py [--json FILE] [--budget-s 480]

(a) each projection of the 8B and 1B configs at batch 1 (bf16): one CUDA graph of one
    product per layer (distinct weights, as in the model, so that no weight stays in
    L2) through cuBLAS (F.linear) and through gemv at each tile config; GPU us per
    product, and its share of the bandwidth floor (the weight's bytes at the copy
    bandwidth measured in the same run);
(b) a ModelRunner of the 8B config in this process (dummy bf16 weights, 128 prompt
    tokens, batch 1), its decode graph captured with every product on cuBLAS and with
    the engine's rule (ARMS): each graph's GPU time over rounds that rotate the order,
    its kernels' time by family (torch.profiler), whether 48 greedy steps give the same
    tokens both ways; and, with the engine's rule, the host's share: how long
    execute_model takes to return (launching, not waiting) and the step period when
    step N+1 is launched before step N's tokens are read, as the workers do;
(c) through the engine (as gpu_decode.py's part b), ITL p50 at batch 1 for 8B and 1B,
    with ENGINE_GEMV=0 and with the default, in rounds that alternate the two, against
    the floor.

Prints a table and writes JSON (default $OUT/gpu_gemv.json, else ./gpu_gemv.json).
A part that would start past --budget-s is skipped; a part's error is recorded.
"""
from __future__ import annotations

import os
import re
import statistics

import torch
import torch.nn.functional as F
from gpu_bench import copy_bandwidth_gb_s, decode_weight_bytes, gpu_ms, versions
from gpu_decode import INPUT_LEN, MODEL_1B, MODEL_8B, DecodeLoop, Run, budget_options, engine_itl

from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.model import kernel_flags
from engine.model.config import ModelConfig
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner
from kernels.gemv import gemv

CONFIGS = [dict(block_n=n, block_k=k, num_warps=w, num_stages=s)
           for n in (8, 16, 32) for k in (256, 512) for w in (4, 8) for s in (3, 4)]
LAYERS_PER_GRAPH = 32
GREEDY_STEPS, ROUNDS, PIPELINED_STEPS = 48, 12, 64
KV_BLOCKS = 4096
GEMV_VAR = "ENGINE_GEMV"
ENGINE_ROUNDS = 3


def projections(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """name -> (N, K) of each product of a decode step at tp=1."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    return {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * d, h), "o": (h, cfg.num_heads * d),
            "gate_up": (2 * i, h), "down": (h, i), "lm_head": (cfg.vocab_size, h)}


def graph_us(call, weights, x) -> float:
    """GPU us per product of a CUDA graph that multiplies x by each weight once."""
    for w in weights:
        call(x, w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            call(x, w)
    return gpu_ms(graph.replay, repeats=20) * 1e3 / len(weights)


def kernel_sweep(bandwidth_gb_s: float) -> list[dict]:
    rows = []
    for model in (MODEL_8B, MODEL_1B):
        for name, (n, k) in projections(resolve_model(model, "dummy").model_config).items():
            count = 4 if name == "lm_head" else LAYERS_PER_GRAPH
            weights = [torch.randn(n, k, dtype=torch.bfloat16, device="cuda") / k ** 0.5
                       for _ in range(count)]
            x = torch.randn(1, k, dtype=torch.bfloat16, device="cuda")
            floor_us = n * k * 2 / (bandwidth_gb_s * 1e3)
            cublas_us = graph_us(F.linear, weights, x)
            tried = {}
            for config in CONFIGS:
                key = "n{block_n}_k{block_k}_w{num_warps}_s{num_stages}".format(**config)
                tried[key] = graph_us(lambda a, w, c=config: gemv(a, w, **c), weights, x)
            engine_us = graph_us(gemv, weights, x)    # the engine's call: the default tile
            best = min(tried, key=tried.get)
            error = ((gemv(x, weights[0]).float() - F.linear(x, weights[0]).float()).abs().max()
                     / F.linear(x, weights[0]).float().abs().max()).item()
            rows.append({"model": model, "projection": name, "n": n, "k": k,
                         "weight_mb": n * k * 2 / 2**20, "floor_us": floor_us,
                         "cublas_us": cublas_us, "gemv_default_us": engine_us,
                         "gemv_best": best, "gemv_best_us": tried[best], "max_rel_difference": error,
                         "configs": tried})
            print(f"  {model} {name:>8} {n:>6}x{k:<6}: floor {floor_us:7.1f} cuBLAS {cublas_us:7.1f} "
                  f"gemv default {engine_us:7.1f} best {tried[best]:7.1f} ({best})",
                  flush=True)
            del weights
            torch.cuda.empty_cache()
    return rows


# -- (b) the 8B runner at batch 1 ----------------------------------------------------

ARMS = {"cublas": False, "engine": True}   # arm -> kernel_flags.GEMV while its graph is captured


def capture(runner: ModelRunner, gemv_on: bool):
    saved = kernel_flags.GEMV
    kernel_flags.GEMV = gemv_on
    try:
        runner.warmup()
    finally:
        kernel_flags.GEMV = saved
    return runner.decode_graphs


def runner_ab() -> dict:
    steps = GREEDY_STEPS + PIPELINED_STEPS + 32
    config = EngineConfig(model=MODEL_8B, max_num_seqs=1, max_model_len=INPUT_LEN + steps + 16, seed=0)
    runner = ModelRunner(resolve_model(MODEL_8B, "dummy"), Communicator(Layout(1, 1), 0),
                         torch.bfloat16, torch.device("cuda", 0), config)
    runner.init_kv_cache(KV_BLOCKS)
    graphs = {arm: capture(runner, gemv_on) for arm, gemv_on in ARMS.items()}
    report = {"graph_us": alternating_replays(graphs), "kernels_us": {}}
    for arm, g in graphs.items():
        report["kernels_us"][arm] = replay_profile(g.graphs[1][0])
    tokens = {}
    for arm in ARMS:
        runner.decode_graphs = graphs[arm]
        torch.manual_seed(0)
        loop = DecodeLoop(runner, 1, steps)
        for _ in range(GREEDY_STEPS):
            loop._step()
        tokens[arm] = loop.tokens[0][INPUT_LEN:]
    report["greedy_equal"] = tokens["cublas"] == tokens["engine"]
    report["first_difference"] = next((i for i, (a, b) in enumerate(zip(*tokens.values())) if a != b), None)
    report["host"] = pipelined(loop)
    print(f"  graph {report['graph_us']}, greedy equal {report['greedy_equal']}, host {report['host']}",
          flush=True)
    for arm, kernels in report["kernels_us"].items():
        print(f"  {arm}: " + ", ".join(f"{k} {v:.0f}" for k, v in kernels.items()), flush=True)
    del runner, graphs, loop
    return report


def alternating_replays(graphs: dict) -> dict:
    """Median GPU us of each arm's batch-1 graph, over rounds that rotate the order."""
    times = {arm: [] for arm in graphs}
    arms = list(graphs)
    for round_ in range(ROUNDS):
        for arm in arms[round_ % len(arms):] + arms[:round_ % len(arms)]:
            times[arm].append(gpu_ms(graphs[arm].graphs[1][0].replay, repeats=10) * 1e3)
    return {arm: statistics.median(values) for arm, values in times.items()}


def replay_profile(graph, replays: int = 10) -> dict:
    """GPU us per replay by kernel family, from torch.profiler."""
    families = {"gemv": "_gemv_kernel", "cublas": "nvjet|gemm|gemv|cutlass", "splitK_reduce": "splitKreduce"}
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    totals = {"all": 0.0, **{family: 0.0 for family in families}, "other": 0.0}
    for event in prof.events():
        if event.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = event.time_range.elapsed_us() / replays
        totals["all"] += us
        family = next((f for f, pattern in families.items() if re.search(pattern, event.name)), "other")
        totals[family] += us
    return totals


def pipelined(loop: DecodeLoop) -> dict:
    torch.cuda.synchronize()
    period_s, returned_s = loop.pipelined_steps(PIPELINED_STEPS)
    return {"execute_model_return_us": returned_s * 1e6, "period_us": period_s * 1e6}


# -- (c) through the engine ------------------------------------------------------------

def engine_arms(bandwidth_gb_s: float) -> dict:
    """ENGINE_ROUNDS per model, each starting both engines, in alternating order: the
    median of each arm's ITL p50."""
    report = {}
    for model in (MODEL_8B, MODEL_1B):
        floor_ms = decode_weight_bytes(resolve_model(model, "dummy").model_config) / (bandwidth_gb_s * 1e6)
        itl, tokens = {"cublas": [], "default": []}, {}
        for round_ in range(ENGINE_ROUNDS):
            for arm in (("cublas", "default") if round_ % 2 == 0 else ("default", "cublas")):
                os.environ[GEMV_VAR] = "0" if arm == "cublas" else "1"
                result = engine_itl(model, [1], 64)
                itl[arm].append(result["runs"][1]["itl_ms"]["p50"])
                tokens[arm] = result["fused_tokens"]
        os.environ.pop(GEMV_VAR, None)
        report[model] = {"floor_ms": floor_ms, "greedy_equal": tokens["cublas"] == tokens["default"],
                         **{arm: {"itl_p50_ms": statistics.median(values), "rounds": values,
                                  "x_floor": statistics.median(values) / floor_ms}
                            for arm, values in itl.items()}}
    return report


def print_table(report: dict) -> None:
    print(f"\n{'model':>13} {'product':>8} {'MB':>6} {'floor':>7} {'cuBLAS':>7} {'gemv':>7} {'best':>7} {'ratio':>6}")
    for row in report.get("kernel_sweep") or []:
        print(f"{row['model']:>13} {row['projection']:>8} {row['weight_mb']:>6.0f} {row['floor_us']:>7.1f} "
              f"{row['cublas_us']:>7.1f} {row['gemv_default_us']:>7.1f} {row['gemv_best_us']:>7.1f} "
              f"{row['gemv_default_us'] / row['cublas_us']:>6.2f}")
    runner = report.get("runner_8b_batch1")
    if runner:
        print(f"\n8B batch 1 runner: graph us {runner['graph_us']}, greedy equal {runner['greedy_equal']}, "
              f"host {runner['host']}")
    for model, arms in (report.get("engine") or {}).items():
        print(f"{model} engine ITL p50 (floor {arms['floor_ms']:.2f} ms): "
              + ", ".join(f"{arm} {arms[arm]['itl_p50_ms']:.2f} ms ({arms[arm]['x_floor']:.2f}x)"
                          for arm in ("cublas", "default") if arms[arm]["itl_p50_ms"])
              + f", greedy equal {arms['greedy_equal']}")


def main() -> None:
    run = Run.of(budget_options(__doc__, "gpu_gemv", 480).parse_args(), "gpu_gemv")
    run.part("versions", versions, needs_s=0)
    bandwidth = run.part("copy_bandwidth_gb_s", copy_bandwidth_gb_s, needs_s=0)
    run.part("kernel_sweep", kernel_sweep, bandwidth, needs_s=30)
    run.part("runner_8b_batch1", runner_ab, needs_s=60)
    run.part("engine", engine_arms, bandwidth, needs_s=150)
    print_table(run.report)
    print(f"wrote {run.path}", flush=True)


if __name__ == "__main__":
    main()
