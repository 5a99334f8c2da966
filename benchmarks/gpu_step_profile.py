"""Where a decode step's GPU time goes, per kernel, on one GPU.

    PYTHONPATH=. python benchmarks/gpu_step_profile.py [--model llama-3.1-8b] [--batch 1]
        [--context 160] [--steps 20] [--json FILE]

A ModelRunner in this process (dummy bf16 weights, the engine's decode CUDA graphs)
decodes `--batch` requests whose context is `--context` tokens, one synchronous
step at a time, under torch.profiler. Per step: the wall time, the GPU's busy time
(the sum of its kernels' and copies' durations) and, per kernel name, calls and
microseconds; the table groups names by what they do. The floor is the same as
gpu_decode.py's: the bytes a step must read at the measured copy bandwidth.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from collections import defaultdict

import torch
from gpu_bench import copy_bandwidth_gb_s, decode_weight_bytes
from gpu_decode import DecodeLoop

from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner

GROUPS = [   # (group, pattern on the kernel's name), first match wins
    ("sampling", r"ArgMax|argmax"),
    ("attention", r"paged_attention"),
    ("rotary + KV write", r"rotary|write_kv"),
    ("RMSNorm", r"rms_norm"),
    ("SiLU-and-mul", r"silu"),
    ("embedding", r"embed"),
    ("GEMM/GEMV", r"nvjet|gemv|gemm|splitK|cutlass|xmma"),   # cuBLAS's, with its split-K reduce
    ("copy", r"[Mm]emcpy|[Mm]emset|copy|index|fill|CatArray"),
]


def group_of(name: str) -> str:
    return next((group for group, pattern in GROUPS if re.search(pattern, name)), "other")


def profile(model: str, batch: int, context: int, steps: int) -> dict:
    config = EngineConfig(model=model, max_num_seqs=max(batch, 1), max_model_len=context + steps + 64, seed=0)
    runner = ModelRunner(resolve_model(model, "dummy"), Communicator(Layout(1, 1), 0), torch.bfloat16,
                         torch.device("cuda", 0), config)
    runner.init_kv_cache(batch * math.ceil((context + steps + 8) / config.block_size) + 1)
    runner.warmup()
    loop = DecodeLoop(runner, batch, steps + 8, input_len=context)
    for _ in range(5):
        loop._step()
    torch.cuda.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            loop._step()
        wall_s = time.perf_counter() - start
    kernels: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[event.name].append(event.time_range.elapsed_us())
    rows = sorted(({"kernel": name[:90], "group": group_of(name), "calls_per_step": len(times) / steps,
                    "us_per_step": sum(times) / steps} for name, times in kernels.items()),
                  key=lambda row: -row["us_per_step"])
    bandwidth = copy_bandwidth_gb_s()
    floor_us = decode_weight_bytes(runner.model.config) / (bandwidth * 1e9) * 1e6
    return {"model": model, "batch": batch, "context": context, "steps": steps,
            "wall_us_per_step": wall_s / steps * 1e6,
            "gpu_busy_us_per_step": sum(row["us_per_step"] for row in rows),
            "floor_us": floor_us, "copy_bandwidth_gb_s": bandwidth,
            "groups": grouped(rows), "kernels": rows}


def grouped(rows: list[dict]) -> dict[str, dict]:
    groups: dict[str, dict] = defaultdict(lambda: {"calls_per_step": 0.0, "us_per_step": 0.0})
    for row in rows:
        groups[row["group"]]["calls_per_step"] += row["calls_per_step"]
        groups[row["group"]]["us_per_step"] += row["us_per_step"]
    return dict(sorted(groups.items(), key=lambda item: -item[1]["us_per_step"]))


def print_report(report: dict) -> None:
    print(f"{report['model']} batch {report['batch']} context {report['context']}: "
          f"wall {report['wall_us_per_step']:.0f} us/step (synchronous), GPU busy "
          f"{report['gpu_busy_us_per_step']:.0f} us, floor {report['floor_us']:.0f} us")
    print(f"{'group':<20}{'calls/step':>11}{'us/step':>10}{'x floor':>9}")
    for group, row in report["groups"].items():
        print(f"{group:<20}{row['calls_per_step']:>11.1f}{row['us_per_step']:>10.1f}"
              f"{row['us_per_step'] / report['floor_us']:>9.3f}")
    print("top kernels:")
    for row in report["kernels"][:12]:
        print(f"  {row['us_per_step']:>8.1f} us  {row['calls_per_step']:>5.1f}x  [{row['group']}] {row['kernel']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=160)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", help="default: $OUT/gpu_step_profile.json, else ./gpu_step_profile.json")
    args = parser.parse_args()
    report = profile(args.model, args.batch, args.context, args.steps)
    print_report(report)
    path = args.json or os.path.join(os.environ.get("OUT", "."), "gpu_step_profile.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
