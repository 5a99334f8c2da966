"""Engine throughput with the probe on vs off, measured side by side in one run.

    python benchmarks/engine_probe_overhead.py [--model tiny-llama] [-tp 2] [-pp 2]
        [--rounds 3] [--json engine_probe_overhead.json]

Each round starts the engine once with the probe off and once on (DIAG_RUN_DIR
set, so every rank and the driver write their run files), generates the same
greedy batch, and times it. The ratio on/off of output tokens/s is the figure;
rounds alternate to spread the machine's noise over both sides.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

from rich.console import Console
from rich.table import Table

from engine.entrypoints.llm import LLM
from engine.sampling_params import SamplingParams

PROMPTS = [f"Request {i}: tell me about pipelines and tensors" for i in range(16)]


def tokens_per_s(model: str, tp: int, pp: int, max_tokens: int, run_dir: str | None) -> float:
    if run_dir:
        os.environ["DIAG_RUN_DIR"] = run_dir
    else:
        os.environ.pop("DIAG_RUN_DIR", None)
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    with LLM(model, tensor_parallel_size=tp, pipeline_parallel_size=pp) as llm:
        llm.generate(PROMPTS[:2], params)  # warm up
        start = time.perf_counter()
        outputs = llm.generate(PROMPTS, params)
        elapsed = time.perf_counter() - start
    return sum(len(o.token_ids) for o in outputs) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("-tp", type=int, default=2)
    parser.add_argument("-pp", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--json", default="engine_probe_overhead.json")
    args = parser.parse_args()
    off, on = [], []
    for _ in range(args.rounds):
        off.append(tokens_per_s(args.model, args.tp, args.pp, args.max_tokens, None))
        with tempfile.TemporaryDirectory() as run_dir:
            on.append(tokens_per_s(args.model, args.tp, args.pp, args.max_tokens, run_dir))
    result = {
        "model": args.model, "tp": args.tp, "pp": args.pp, "machine": platform.node(),
        "cpus": os.cpu_count(), "tokens_per_s_off": off, "tokens_per_s_on": on,
        "ratio_on_off": statistics.median(on) / statistics.median(off),
    }
    table = Table(title=f"{args.model} tp={args.tp} pp={args.pp}: output tokens/s")
    for column in ("round", "probe off", "probe on", "on/off"):
        table.add_column(column, justify="right")
    for i, (a, b) in enumerate(zip(off, on)):
        table.add_row(str(i), f"{a:.1f}", f"{b:.1f}", f"{b / a:.3f}")
    table.add_row("median", f"{statistics.median(off):.1f}", f"{statistics.median(on):.1f}",
                  f"{result['ratio_on_off']:.3f}")
    Console().print(table)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
