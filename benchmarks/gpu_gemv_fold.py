"""The RMSNorm and SiLU-and-mul folded into the batch-1 gemv, before and after, in one
GPU call (kernels/gemv.py; ENGINE_GEMV_FOLD=0 is "before").

    PYTHONPATH=.:benchmarks python benchmarks/gpu_gemv_fold.py [--json FILE] [--budget-s 480]

(a) copy bandwidth and each model's decode floor (gpu_bench.py's);
(b) each folded product alone at the 8B and 1B shapes (qkv after a norm with its
    residual, at the row block of 16 that a folded norm takes and at 8; gate_up between
    that norm and SiLU-and-mul, the activation folded in as the engine does, and both):
    a CUDA graph over every layer's own weight per path, GPU us per layer, and the
    largest difference from the separate kernels;
(c) per model, in this process, a ModelRunner's decode graph (GPU time) at batch 1, 32
    and 128 captured before and after;
(d) through the engine, as `python -m engine bench --load-format dummy --dtype bfloat16
    --input-len 128 --output-len 64` with all requests at once: two engines per model
    side by side, before and after, rounds alternating which goes first; per batch size
    the median over rounds of each one's ITL p50, against the floor; and the two
    engines' greedy tokens for gpu_decode's parity prompts;
(e) the probe's cost per decode step, after: gpu_decode's in-process A/B over the 8B
    runner at batch 1, synchronous and pipelined steps.
"""
from __future__ import annotations

import dataclasses
import math
import statistics

import torch
from gpu_bench import copy_bandwidth_gb_s, decode_weight_bytes, versions
from gpu_decode import (
    ASYNC_AB_KV_BYTES,
    INPUT_LEN,
    MODEL_1B,
    MODEL_8B,
    DecodeLoop,
    Plan,
    Run,
    budget_options,
    engine_config,
    graph_ms,
    graph_of,
    greedy_tokens,
    kernel_flag,
    num,
    parity_prompts,
    probe_ab,
)

from engine.bench.bench import measure, random_prompts
from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner

FOLD_VAR = "ENGINE_GEMV_FOLD"
ARMS = {"before": False, "after": True}
AIMS = {(MODEL_8B, 1): 1.12, (MODEL_8B, 32): 1.3, (MODEL_8B, 128): 1.5, (MODEL_1B, 1): 1.4, (MODEL_1B, 128): 2.5}
BATCHES = [1, 32, 128]
OUTPUT_LEN = 64
ROUNDS = 5


def folded(on: bool):
    return kernel_flag(FOLD_VAR, "GEMV_FOLD", on)


# -- (b) the products alone ---------------------------------------------------------------

def products_alone(model: str, bandwidth_gb_s: float) -> dict:
    from kernels.activation import silu_and_mul
    from kernels.gemv import gemv
    from kernels.norm import rms_norm

    cfg = resolve_model(model, "dummy").model_config
    h, eps = cfg.hidden_size, cfg.rms_norm_eps
    x, residual = (torch.randn(1, h, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    g = torch.rand(h, dtype=torch.bfloat16, device="cuda") + 0.5

    def normed():
        return rms_norm(x, g, eps, residual)[0]

    qkv_paths = {"separate": lambda w: gemv(normed(), w),
                 "norm_folded": lambda w: gemv(x, w, g, eps, residual)[0],
                 "norm_folded_n8": lambda w: gemv(x, w, g, eps, residual, block_n=8)[0]}
    gate_up_paths = {"separate": lambda w: silu_and_mul(gemv(normed(), w)),
                     "silu_folded": lambda w: gemv(normed(), w, silu_and_mul=True),
                     "both_folded": lambda w: gemv(x, w, g, eps, residual, silu_and_mul=True)[0]}
    products = {"qkv": ((cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, qkv_paths),
                "gate_up": (2 * cfg.intermediate_size, gate_up_paths)}
    report = {}
    for name, (rows, paths) in products.items():
        weights = [torch.randn(rows, h, dtype=torch.bfloat16, device="cuda") / h ** 0.5
                   for _ in range(cfg.num_layers)]
        reference = paths["separate"](weights[0]).float()
        row = {"floor_us": weights[0].numel() * 2 / (bandwidth_gb_s * 1e3)}
        for arm, fn in paths.items():
            difference = ((fn(weights[0]).float() - reference).abs().max() / reference.abs().max()).item()
            row[arm] = {"us_per_layer": graph_of(fn, weights) * 1e3 / len(weights), "max_rel_difference": difference}
        report[name] = row
        print(f"  {model} {name} ({rows}, {h}): {row}", flush=True)
        del weights
    return report



# -- (c) the decode graphs, (e) the probe ---------------------------------------------------

def runner_graphs(model: str, switch, probe_plan: Plan | None, batches: list[int] = BATCHES) -> dict:
    """switch(on): the context in which the "after" arm (on) or the "before" arm runs."""
    steps = 2 * probe_plan.probe_rounds * 2 * probe_plan.steps_per_arm + 8 if probe_plan else 8
    config = EngineConfig(model=model, max_num_seqs=128, max_model_len=INPUT_LEN + steps + 16, seed=0)
    runner = ModelRunner(resolve_model(model, "dummy"), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    runner.init_kv_cache(math.ceil((INPUT_LEN + steps + 1) / config.block_size) + 1)
    report = {}
    for arm, on in ARMS.items():
        with switch(on):
            report[f"graph_ms_{arm}"] = graph_ms(runner, batches)
    print(f"  {model} decode graph ms: {report}", flush=True)
    if probe_plan:
        report["probe"] = probe_ab(DecodeLoop(runner, 1, steps), probe_plan)
    del runner
    return report


# -- (d) through the engine -----------------------------------------------------------------

def engine_ab(model: str, switch) -> dict:
    """switch(on): the context in which the "after" arm's engine (on) or the "before" one starts."""
    engines = {}
    try:
        for arm, on in ARMS.items():
            with switch(on):
                engines[arm] = LLMEngine(dataclasses.replace(engine_config(model),
                                                             kv_cache_memory_bytes=ASYNC_AB_KV_BYTES))
        vocab = engines["after"].model_config.vocab_size
        for engine in engines.values():
            measure(engine, random_prompts(4, INPUT_LEN, vocab, seed=99), 4, "warmup")
        tokens = {arm: greedy_tokens(engine, parity_prompts(vocab)) for arm, engine in engines.items()}
        report = {"parity_equal": tokens["before"] == tokens["after"],
                  "first_difference": [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                                       for x, y in zip(tokens["before"], tokens["after"])]}
        for batch in BATCHES:
            prompts = random_prompts(batch, INPUT_LEN, vocab, seed=batch)
            itl = {arm: [] for arm in ARMS}
            for round_ in range(ROUNDS):
                for arm in (list(ARMS) if round_ % 2 == 0 else list(ARMS)[::-1]):
                    itl[arm].append(measure(engines[arm], prompts, OUTPUT_LEN, str(batch)).itl_ms.p50)
            report[batch] = {"itl_p50_ms": {arm: statistics.median(v) for arm, v in itl.items()}, "rounds": itl}
            print(f"  {model} batch {batch}: {report[batch]['itl_p50_ms']}", flush=True)
        return report
    finally:
        for engine in engines.values():
            engine.shutdown()


# -- the run ----------------------------------------------------------------------------------

def main() -> None:
    args = budget_options(__doc__, "gpu_gemv_fold", 480).parse_args()
    run = Run.of(args, "gpu_gemv_fold")
    run.part("versions", versions, needs_s=0)
    bandwidth = run.part("copy_bandwidth_gb_s", copy_bandwidth_gb_s, needs_s=10)
    for model in (MODEL_8B, MODEL_1B):
        run.part(f"products/{model}", products_alone, model, bandwidth, needs_s=20)
    for model in (MODEL_8B, MODEL_1B):
        run.part(f"engine/{model}", engine_ab, model, folded, needs_s=90)
    probe_plan = dataclasses.replace(Plan.of(False), probe_rounds=30)
    run.part(f"runner/{MODEL_8B}", runner_graphs, MODEL_8B, folded, probe_plan, needs_s=60)
    run.part(f"runner/{MODEL_1B}", runner_graphs, MODEL_1B, folded, None, needs_s=30)
    run.report["summary"] = summary(run.report)
    run.write()
    print_summary(run.report)
    print(f"wrote {run.path}", flush=True)


def summary(report: dict) -> list[dict]:
    bandwidth = report.get("copy_bandwidth_gb_s")
    rows = []
    for model in (MODEL_8B, MODEL_1B):
        floor_ms = decode_weight_bytes(resolve_model(model, "dummy").model_config) / (bandwidth * 1e9) * 1e3 \
            if bandwidth else None
        engine = report.get(f"engine/{model}", {})
        for batch in BATCHES:
            itl = engine.get(batch, {}).get("itl_p50_ms", {})
            row = {"model": model, "batch": batch, "floor_ms": floor_ms, "aim": AIMS.get((model, batch))}
            for arm in ARMS:
                row[f"itl_{arm}_ms"] = itl.get(arm)
                row[f"x_floor_{arm}"] = itl[arm] / floor_ms if arm in itl and floor_ms else None
            rows.append(row)
    return rows


def print_summary(report: dict) -> None:
    print(f"copy bandwidth: {num(report.get('copy_bandwidth_gb_s'), '.0f')} GB/s")
    print(f"{'model':<14}{'batch':>6}{'floor':>8}{'before':>9}{'x':>6}{'after':>9}{'x':>6}{'aim':>6}")
    for r in report["summary"]:
        print(f"{r['model']:<14}{r['batch']:>6}{num(r['floor_ms'], '.3f'):>8}{num(r['itl_before_ms'], '.3f'):>9}"
              f"{num(r['x_floor_before'], '.2f'):>6}{num(r['itl_after_ms'], '.3f'):>9}"
              f"{num(r['x_floor_after'], '.2f'):>6}{num(r['aim'], '.2f'):>6}")
    for name, value in report.items():
        if name.startswith("engine/"):
            print(f"{name}: greedy tokens equal before/after: {value['parity_equal']} {value['first_difference']}")
        if name.startswith("products/"):
            for product, row in value.items():
                print(f"{name} {product}: floor {row['floor_us']:.1f} us, " + ", ".join(
                    f"{arm} {v['us_per_layer']:.1f} us ({v['max_rel_difference']:.1e})"
                    for arm, v in row.items() if arm != "floor_us"))
        if name.startswith("runner/"):
            print(f"{name}: decode graph ms before {value['graph_ms_before']}, after {value['graph_ms_after']}")
            for mode in ("synchronous", "pipelined"):
                if "probe" in value:
                    p = value["probe"][mode]
                    print(f"probe, {mode} steps: +{p['added_us_per_step']:.1f} us/step, 95% CI "
                          f"[{p['ci95_us'][0]:.1f}, {p['ci95_us'][1]:.1f}], {p['added_percent']:.2f}% of a "
                          f"{p['step_us_probe_off']:.0f} us step")
    for name in report["errors"]:
        print(f"{name}: FAILED (see errors in the JSON)")
    for name in report["skipped"]:
        print(f"{name}: skipped (budget)")


if __name__ == "__main__":
    main()
