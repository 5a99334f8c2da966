"""Decode on one GPU against the HBM floor measured in the same run, in one call.

    PYTHONPATH=. python benchmarks/gpu_decode.py [--json FILE] [--budget-s 460] [--quick]

(a) copy bandwidth and each model's decode floor (gpu_bench.py's: the bytes a decode
    step must read / a device-to-device copy's bandwidth);
(b) through the engine (dummy bf16 weights, 128 prompt tokens, all requests at once,
    as `python -m engine bench --load-format dummy --dtype bfloat16 --input-len 128`):
    ITL p50 at each batch size, its ratio to the floor and to the issue's aim;
(c) greedy parity: the same prompts' tokens with the fused kernels and with
    ENGINE_FUSED_KERNELS=0 (the unfused path, as before the fusions);
(d) in this process, a ModelRunner of the 8B config: the decode graph's GPU time fused
    and unfused, and the probe's cost per decode step: rounds alternate the probe on
    and off over the same runner (a paired A/B), mean added us with a 95% interval,
    over synchronous steps (all of the probe's host time shows) and over pipelined
    ones (step N+1 launched before step N's tokens are read, as the workers run);
(e) the gate/up product with SiLU-and-mul as its epilogue (kernels/activation.py's
    gate_up_silu, which the engine does not use) against cuBLAS then silu_and_mul: one
    CUDA graph over every layer's weight per path, GPU time per layer;
(f) async scheduling's effect on the ITL: three engines side by side, each with its
    own share of the KV memory: async scheduling with the workers' overlap (the
    default), async scheduling with ENGINE_WORKER_OVERLAP=0 (each worker replies
    before it takes the next batch), and --no-async-scheduling; rounds rotate which
    one runs first; per batch size the medians of their ITL p50 and each one's ratio
    to the default; and the three engines' greedy tokens for the parity prompts.

Each part runs inside the wall-clock budget (a part that would start past it is
skipped), in try/except: its result or its error goes into the JSON, rewritten after
every part. --quick runs the 1B config only, with fewer tokens and rounds.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from gpu_bench import (
    ENGINE_FLAGS,
    copy_bandwidth_gb_s,
    decode_weight_bytes,
    free_gpu,
    gpu_ms,
    greedy_batch,
    versions,
)

from diagnose import probe
from diagnose.core.vocab import Phase, Role
from engine.bench.bench import measure, random_prompts
from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.model import kernel_flags
from engine.model.loader import resolve_model
from engine.sampling_params import SamplingParams
from engine.scheduler_output import PENDING_TOKEN, SchedulerOutput
from engine.worker.model_runner import ModelRunner

MODEL_8B, MODEL_1B = "llama-3.1-8b", "llama-3.2-1b"
AIMS = {(MODEL_8B, 1): 1.25, (MODEL_8B, 32): 1.5, (MODEL_8B, 128): 2.0, (MODEL_1B, 1): 2.0}
INPUT_LEN = 128
PARITY_PROMPTS, PARITY_TOKENS = 8, 32
FUSED_VAR = "ENGINE_FUSED_KERNELS"
OVERLAP_VAR = "ENGINE_WORKER_OVERLAP"
ASYNC_AB_KV_BYTES = 8 << 30        # each engine's KV cache in part (f): all fit beside each other
ASYNC_ARMS = {                     # part (f): name -> (async_scheduling, the workers' overlap)
    "async": (True, True), "async_no_overlap": (True, False), "sync": (False, True)}




@dataclass
class Plan:
    itl: list[tuple[str, list[int]]]   # (model, batch sizes), in the order they run
    output_len: int                    # generated tokens per request in the ITL runs
    runner_model: str                  # the in-process runner of part (d)
    probe_rounds: int
    steps_per_arm: int                 # decode steps per round with the probe on, and off
    async_rounds: int                  # part (f): rounds per batch size, each engine once

    @classmethod
    def of(cls, quick: bool) -> Plan:
        if quick:
            return cls([(MODEL_1B, [1, 32])], 16, MODEL_1B, 6, 8, 3)
        return cls([(MODEL_8B, [1, 32, 128]), (MODEL_1B, [1, 32, 128])], 64, MODEL_8B, 60, 16, 6)


# -- (b) ITL through the engine, (c) greedy parity ----------------------------------------

@contextmanager
def kernel_flag(env_var: str, name: str, on: bool):
    """The engine's workers read env_var when they start; this process's
    engine.model.kernel_flags.<name> is read at every op."""
    saved_env, saved_flag = os.environ.get(env_var), getattr(kernel_flags, name)
    os.environ[env_var] = "1" if on else "0"
    setattr(kernel_flags, name, on)
    try:
        yield
    finally:
        setattr(kernel_flags, name, saved_flag)
        if saved_env is None:
            os.environ.pop(env_var, None)
        else:
            os.environ[env_var] = saved_env


def fused_kernels(on: bool):
    return kernel_flag(FUSED_VAR, "FUSED_KERNELS", on)


def engine_config(model: str) -> EngineConfig:
    return EngineConfig(model=model, load_format="dummy", dtype="bfloat16", **ENGINE_FLAGS)


def greedy_tokens(engine: LLMEngine, prompts: list[list[int]]) -> list[list[int]]:
    params = SamplingParams(temperature=0.0, max_tokens=PARITY_TOKENS, ignore_eos=True)
    tokens = {engine.add_request(p, params): [] for p in prompts}
    while engine.has_unfinished_requests():
        for output in engine.step():
            tokens[output.req_id] += output.new_token_ids
    return list(tokens.values())


def parity_prompts(vocab_size: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(7)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist()
            for n in (3, 17, 64, 100, 128, 5, 31, 250)[:PARITY_PROMPTS]]


def engine_itl(model: str, batches: list[int], output_len: int) -> dict:
    """One engine (fused kernels): a warm-up, one run per batch size, then the parity
    prompts' greedy tokens."""
    with fused_kernels(True):
        engine = LLMEngine(engine_config(model))
    try:
        vocab = engine.model_config.vocab_size
        measure(engine, random_prompts(4, INPUT_LEN, vocab, seed=99), 4, "warmup")
        runs = {}
        for batch in batches:
            result = measure(engine, random_prompts(batch, INPUT_LEN, vocab, seed=batch), output_len, str(batch))
            itl = dataclasses.asdict(result.itl_ms) if result.itl_ms else None
            runs[batch] = {"itl_ms": itl, "output_tokens_per_s": result.output_tokens_per_s}
            print(f"  {model} batch {batch}: ITL {itl} ms, {result.output_tokens_per_s:.0f} tok/s", flush=True)
        return {"runs": runs, "fused_tokens": greedy_tokens(engine, parity_prompts(vocab))}
    finally:
        engine.shutdown()


def parity(model: str, fused_tokens: list[list[int]]) -> dict:
    with fused_kernels(False):
        engine = LLMEngine(engine_config(model))
    try:
        unfused = greedy_tokens(engine, parity_prompts(engine.model_config.vocab_size))
    finally:
        engine.shutdown()
    first_difference = [next((i for i, (a, b) in enumerate(zip(x, y)) if a != b), None)
                        for x, y in zip(fused_tokens, unfused)]
    return {"equal": fused_tokens == unfused, "prompts": len(unfused), "tokens": PARITY_TOKENS,
            "first_difference": first_difference}


# -- (d) in process: fused against unfused graphs, the probe's cost ----------------------

class DecodeLoop:
    """Requests of a fixed context decoding one token per step through a ModelRunner."""

    def __init__(self, runner: ModelRunner, batch: int, max_steps: int, input_len: int = INPUT_LEN):
        self.runner = runner
        blocks_per_seq = math.ceil((input_len + max_steps + 1) / runner.block_size)
        self.block_ids = [list(range(b * blocks_per_seq, (b + 1) * blocks_per_seq)) for b in range(batch)]
        self.tokens = torch.randint(0, 1000, (batch, input_len)).tolist()
        self.step_id = 0
        self._step()    # step 0: the prefill

    def _step(self):
        self._append(self.runner.execute_model(greedy_batch(self.step_id, self.tokens, self.block_ids)).output())
        self.step_id += 1

    def timed_step(self) -> float:
        """One decode step with the probe calls a worker makes around it; seconds."""
        start = time.perf_counter()
        with probe.phase(Phase.DEQUEUE, step=self.step_id):
            pass
        probe.ring_read(self.step_id)
        with probe.phase(Phase.EXECUTE_MODEL, step=self.step_id):
            self._step()
        return time.perf_counter() - start

    def pipelined_steps(self, n: int) -> tuple[float, float]:
        """n decode steps as a worker runs them: each is launched before the previous
        step's tokens are read, its input being those tokens on the GPU (PENDING_TOKEN),
        with a worker's probe calls around it. (Seconds per step, median seconds until
        execute_model returned.)"""
        batch, previous, returned = len(self.tokens), None, []
        start = time.perf_counter()
        for _ in range(n):
            ahead = previous is not None     # launched, its tokens not in self.tokens yet
            out = SchedulerOutput(self.step_id, [f"r{b}" for b in range(batch)],
                                  [len(seq) - 1 + ahead for seq in self.tokens],
                                  [[PENDING_TOKEN]] * batch, [True] * batch, [[] for _ in range(batch)])
            with probe.phase(Phase.DEQUEUE, step=self.step_id):
                pass
            probe.ring_read(self.step_id)
            launched = time.perf_counter()
            with probe.phase(Phase.EXECUTE_MODEL, step=self.step_id):
                sampled = self.runner.execute_model(out)
            returned.append(time.perf_counter() - launched)
            self.step_id += 1
            if previous is not None:
                self._append(previous.output())
            previous = sampled
        self._append(previous.output())
        return (time.perf_counter() - start) / n, statistics.median(returned)

    def _append(self, output) -> None:
        for seq, token in zip(self.tokens, output.sampled_token_ids):
            seq.append(token)


def graph_ms(runner: ModelRunner, batches: list[int]) -> dict:
    runner.warmup()
    return {batch: gpu_ms(runner.decode_graphs.graphs[batch][0].replay) for batch in batches}


def in_process(model: str, plan: Plan) -> dict:
    """The decode graphs' GPU time fused and unfused (batch 1, 32, 128), then the probe A/B
    at batch 1: each round runs steps_per_arm steps with the probe on and as many off, in
    alternating order; the round's figure is mean(on) - mean(off)."""
    steps = 2 * plan.probe_rounds * 2 * plan.steps_per_arm + 8   # synchronous, then pipelined
    config = EngineConfig(model=model, max_num_seqs=128, max_model_len=INPUT_LEN + steps + 16, seed=0)
    runner = ModelRunner(resolve_model(model, "dummy"), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    runner.init_kv_cache(math.ceil((INPUT_LEN + steps + 1) / config.block_size) + 1)
    report = {}
    with fused_kernels(False):
        report["graph_ms_unfused"] = graph_ms(runner, [1, 32, 128])
    with fused_kernels(True):
        report["graph_ms_fused"] = graph_ms(runner, [1, 32, 128])
        print(f"  graph replay ms, unfused {report['graph_ms_unfused']}, fused {report['graph_ms_fused']}",
              flush=True)
        report["probe"] = probe_ab(DecodeLoop(runner, 1, steps), plan)
    del runner
    return report


def probe_ab(loop: DecodeLoop, plan: Plan) -> dict:
    """The probe's cost per decode step, twice: over synchronous steps (the whole of its
    host time shows) and over pipelined ones, as a worker runs them."""
    with tempfile.TemporaryDirectory(ignore_cleanup_errors=True) as run_dir:
        os.environ[probe.RUN_DIR_VAR] = run_dir
        probe.init(Role.WORKER, rank=0, world_size=1, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                   device="cuda:0")
        recorder = probe._probe
        try:
            for _ in range(8):
                loop.timed_step()
            synchronous = ab_rounds(plan, recorder, lambda: statistics.fmean(
                loop.timed_step() for _ in range(plan.steps_per_arm)))
            pipelined = ab_rounds(plan, recorder, lambda: loop.pipelined_steps(plan.steps_per_arm)[0])
            marks_us = probe_marks_us(200)
        finally:
            probe._probe = recorder
            os.environ.pop(probe.RUN_DIR_VAR, None)
    return {"model_batch": 1, "rounds": plan.probe_rounds, "steps_per_arm": plan.steps_per_arm,
            "synchronous": synchronous, "pipelined": pipelined, "marks_alone_us": marks_us,
            "note": "tp=1: a replay holds no collective, so the probe's per-step work is its phases; "
                    "the heartbeat thread runs in both arms"}


def ab_rounds(plan: Plan, recorder, seconds_per_step) -> dict:
    """Rounds of seconds_per_step() with the probe on and off, in alternating order; a
    round's figure is on - off."""
    differences, off = [], []
    for round_ in range(plan.probe_rounds):
        per_step = {}
        for on in ((True, False) if round_ % 2 else (False, True)):
            probe._probe = recorder if on else None
            per_step[on] = seconds_per_step()
        probe._probe = recorder
        off.append(per_step[False])
        differences.append((per_step[True] - per_step[False]) * 1e6)
    mean, half_width = mean_ci95(differences)
    step_us = statistics.median(off) * 1e6
    return {"added_us_per_step": mean, "ci95_us": [mean - half_width, mean + half_width],
            "step_us_probe_off": step_us, "added_percent": 100 * mean / step_us,
            "round_differences_us": differences}


def probe_marks_us(steps: int) -> float:
    """The host time of one step's probe calls (a worker's and the runner's), no model.
    Few steps: past MAX_STEP_WORK unfinished phases the probe records no more events."""
    start = time.perf_counter()
    for step in range(steps):
        with probe.phase(Phase.DEQUEUE, step=step):
            pass
        probe.ring_read(step)
        with probe.phase(Phase.EXECUTE_MODEL, step=step):
            with probe.phase(Phase.FORWARD, step=step):
                pass
            with probe.phase(Phase.SAMPLE, step=step):
                pass
    return (time.perf_counter() - start) / steps * 1e6


def mean_ci95(values: list[float]) -> tuple[float, float]:
    """The mean and the half-width of its 95% t-interval (Cornish-Fisher t quantile)."""
    n = len(values)
    z, df = 1.959964, n - 1
    t = z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
    return statistics.fmean(values), t * statistics.stdev(values) / math.sqrt(n)


# -- (e) gate/up with its activation fused ----------------------------------------------

def mlp_fusion(model: str, batches: list[int]) -> dict:
    from kernels.activation import gate_up_silu, silu_and_mul

    cfg = resolve_model(model, "dummy").model_config
    weights = [torch.randn(2 * cfg.intermediate_size, cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
               for _ in range(cfg.num_layers)]
    report = {"layers": cfg.num_layers, "weight_bytes_per_layer": weights[0].numel() * 2}
    for batch in batches:
        x = torch.randn(batch, cfg.hidden_size, dtype=torch.bfloat16, device="cuda")
        paths = {"cublas_then_silu": lambda w, x=x: silu_and_mul(torch.nn.functional.linear(x, w))}
        for block_n in (32, 64, 128):
            paths[f"fused_block_n{block_n}"] = lambda w, x=x, n=block_n: gate_up_silu(x, w, block_n=n)
        reference = paths["cublas_then_silu"](weights[0]).float()
        row = {}
        for name, fn in paths.items():
            try:
                error = ((fn(weights[0]).float() - reference).abs().max() / reference.abs().max()).item()
                row[name] = {"us_per_layer": graph_of(fn, weights) * 1e3 / len(weights), "max_rel_error": error}
            except Exception as e:  # noqa: BLE001 - one tile size that does not fit must not end the part
                row[name] = {"us_per_layer": None, "error": repr(e)}
        report[batch] = row
        print(f"  {model} batch {batch}: {row}", flush=True)
    del weights
    return report


def graph_of(fn, weights) -> float:
    """GPU ms of one CUDA graph that applies fn to each weight in turn."""
    for w in weights[:2]:
        fn(w)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for w in weights:
            fn(w)
    return gpu_ms(graph.replay, repeats=20)


# -- (f) async scheduling on and off ------------------------------------------------------

def async_ab(model: str, batches: list[int], plan: Plan) -> dict:
    engines = {}
    try:
        for name, (on, overlap) in ASYNC_ARMS.items():
            os.environ[OVERLAP_VAR] = "1" if overlap else "0"   # the workers read it at start
            engines[name] = LLMEngine(dataclasses.replace(engine_config(model), async_scheduling=on,
                                                          kv_cache_memory_bytes=ASYNC_AB_KV_BYTES))
        vocab = engines["async"].model_config.vocab_size
        for engine in engines.values():
            measure(engine, random_prompts(4, INPUT_LEN, vocab, seed=99), 4, "warmup")
        tokens = {name: greedy_tokens(engine, parity_prompts(vocab)) for name, engine in engines.items()}
        report = {"parity_equal": all(t == tokens["async"] for t in tokens.values())}
        for batch in batches:
            report[batch] = ab_round(engines, batch, vocab, plan)
        return report
    finally:
        os.environ.pop(OVERLAP_VAR, None)
        for engine in engines.values():
            engine.shutdown()


def ab_round(engines: dict[str, LLMEngine], batch: int, vocab: int, plan: Plan) -> dict:
    prompts = random_prompts(batch, INPUT_LEN, vocab, seed=batch)
    names = list(engines)
    itl = {name: [] for name in names}
    for round_ in range(plan.async_rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            itl[name].append(measure(engines[name], prompts, plan.output_len, str(batch)).itl_ms.p50)
    p50 = {name: statistics.median(values) for name, values in itl.items()}
    print(f"  batch {batch}: ITL p50 " + ", ".join(f"{n} {v:.3f} ms" for n, v in p50.items()), flush=True)
    return {"itl_p50_ms": p50, "ratio_to_async": {n: v / p50["async"] for n, v in p50.items()},
            "rounds": itl}


# -- the run -------------------------------------------------------------------------------

def budget_options(doc: str, name: str, budget_s: float) -> argparse.ArgumentParser:
    """The options of every budgeted GPU benchmark: --json and --budget-s."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--json", help=f"output file (default: $OUT/{name}.json, else ./{name}.json)")
    parser.add_argument("--budget-s", type=float, default=budget_s, help="wall-clock budget for the parts")
    return parser


class Run:
    @classmethod
    def of(cls, args: argparse.Namespace, name: str) -> Run:
        return cls(args.json or os.path.join(os.environ.get("OUT", "."), f"{name}.json"), args.budget_s)

    def __init__(self, path: str, budget_s: float):
        self.path = path
        self.deadline = time.monotonic() + budget_s
        self.report: dict = {"seconds": {}, "errors": {}, "skipped": []}

    def part(self, name: str, fn, *args, needs_s: float = 30):
        """fn's result under report[name], or its error; skipped if under needs_s are left."""
        left = self.deadline - time.monotonic()
        if left < needs_s:
            self.report["skipped"].append(name)
            print(f"[{name}] skipped: {left:.0f} s of the budget left, needs {needs_s:.0f}", flush=True)
            return None
        start = time.perf_counter()
        print(f"[{name}] ...", flush=True)
        try:
            self.report[name] = fn(*args)
        except Exception:  # noqa: BLE001 - any part's failure is recorded and the run goes on
            self.report["errors"][name] = traceback.format_exc()
            print(f"[{name}] failed:\n{self.report['errors'][name]}", flush=True)
        free_gpu()
        self.report["seconds"][name] = round(time.perf_counter() - start, 1)
        print(f"[{name}] {self.report['seconds'][name]} s", flush=True)
        self.write()
        return self.report.get(name)

    def write(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.report, f, indent=2)


def main() -> None:
    parser = budget_options(__doc__, "gpu_decode", 460)
    parser.add_argument("--quick", action="store_true", help="1B only, fewer tokens and rounds: a check")
    args = parser.parse_args()
    plan = Plan.of(args.quick)
    run = Run.of(args, "gpu_decode")
    run.part("versions", versions, needs_s=0)
    run.part("copy_bandwidth_gb_s", copy_bandwidth_gb_s, needs_s=10)
    fused_tokens = {}
    for model, batches in plan.itl:
        result = run.part(f"itl/{model}", engine_itl, model, batches, plan.output_len, needs_s=60)
        if result:
            fused_tokens[model] = result.pop("fused_tokens")
    parity_models = [model for model, _ in plan.itl]
    for model in sorted(fused_tokens, key=lambda m: m != MODEL_1B):
        run.part(f"parity/{model}", parity, model, fused_tokens[model], needs_s=60)
        parity_models.remove(model)
    run.report["skipped"] += [f"parity/{model}" for model in parity_models]
    run.part(f"in_process/{plan.runner_model}", in_process, plan.runner_model, plan, needs_s=60)
    for model, batches in plan.itl:
        run.part(f"mlp_fusion/{model}", mlp_fusion, model, batches, needs_s=30)
    for model, batches in plan.itl:
        run.part(f"async_ab/{model}", async_ab, model, batches, plan, needs_s=90)
    run.report["summary"] = summary(run.report, plan)
    run.write()
    print_table(run.report["summary"], run.report)
    print(f"wrote {run.path}", flush=True)


def summary(report: dict, plan: Plan) -> list[dict]:
    bandwidth = report.get("copy_bandwidth_gb_s")
    rows = []
    for model, batches in plan.itl:
        floor_ms = decode_weight_bytes(resolve_model(model, "dummy").model_config) / (bandwidth * 1e9) * 1e3 \
            if bandwidth else None
        runs = report.get(f"itl/{model}", {}).get("runs", {})
        for batch in batches:
            run = runs.get(batch)
            itl = run["itl_ms"]["p50"] if run and run["itl_ms"] else None
            ratio = itl / floor_ms if itl and floor_ms else None
            aim = AIMS.get((model, batch))
            rows.append({"model": model, "batch": batch, "floor_ms": floor_ms, "itl_p50_ms": itl,
                         "x_floor": ratio, "aim": aim, "met": None if ratio is None or aim is None else ratio <= aim,
                         "output_tokens_per_s": run["output_tokens_per_s"] if run else None})
    return rows


def num(value, fmt: str) -> str:
    """A table cell: the value formatted, or '-' where it was not measured."""
    return "-" if value is None else format(value, fmt)


def print_table(rows: list[dict], report: dict) -> None:
    print(f"copy bandwidth: {num(report.get('copy_bandwidth_gb_s'), '.0f')} GB/s", flush=True)
    print(f"{'model':<14}{'batch':>6}{'floor ms':>10}{'ITL p50':>10}{'x floor':>9}{'aim':>6}{'met':>6}{'tok/s':>9}")
    for r in rows:
        print(f"{r['model']:<14}{r['batch']:>6}{num(r['floor_ms'], '.3f'):>10}{num(r['itl_p50_ms'], '.3f'):>10}"
              f"{num(r['x_floor'], '.2f'):>9}{num(r['aim'], '.2f'):>6}{r['met'] if r['met'] is not None else '-'!s:>6}"
              f"{num(r['output_tokens_per_s'], '.0f'):>9}")
    for name, value in report.items():
        if name.startswith("parity/"):
            print(f"{name}: equal={value['equal']} first_difference={value['first_difference']}")
        if name.startswith("mlp_fusion/"):
            for batch, row in value.items():
                if isinstance(row, dict):
                    print(f"{name} batch {batch}: " + ", ".join(f"{k} {v['us_per_layer']} us"
                                                               for k, v in row.items()))
        if name.startswith("async_ab/"):
            print(f"{name}: greedy tokens equal across the arms: {value['parity_equal']}")
            for batch, row in value.items():
                if isinstance(row, dict):
                    print(f"{name} batch {batch}: ITL p50 " + ", ".join(
                        f"{arm} {ms:.3f} ms ({row['ratio_to_async'][arm]:.2f})"
                        for arm, ms in row["itl_p50_ms"].items()))
        if name.startswith("in_process/"):
            print(f"{name}: graph ms unfused {value['graph_ms_unfused']}, fused {value['graph_ms_fused']}")
            for mode in ("synchronous", "pipelined"):
                p = value["probe"][mode]
                print(f"probe, {mode} steps: +{p['added_us_per_step']:.1f} us/step, 95% CI "
                      f"[{p['ci95_us'][0]:.1f}, {p['ci95_us'][1]:.1f}], {p['added_percent']:.2f}% of a "
                      f"{p['step_us_probe_off']:.0f} us step")
            print(f"probe: the marks alone {value['probe']['marks_alone_us']:.1f} us")
    for name in report["errors"]:
        print(f"{name}: FAILED (see errors in the JSON)")
    for name in report["skipped"]:
        print(f"{name}: skipped (budget)")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
