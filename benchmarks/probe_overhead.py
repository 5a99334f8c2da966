"""What the probe costs the engine: ns per phase marker (enter + exit) and per
traced collective (record + completion), off and on. Where CUDA is present,
also a traced collective on a CUDA tensor (two CUDA events, polled by the
heartbeat thread) and, for comparison, the alternative the probe does not use:
a one-thread kernel that writes a counter into pinned host memory.

    python benchmarks/probe_overhead.py [--iterations N] [--json PATH]

Prints a table and writes the numbers as JSON (default probe_overhead.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import time

import torch

from diagnose import probe


def per_call_ns(body, iterations: int) -> float:
    """The best of 5 runs, to keep other processes' noise out."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter_ns()
        body(iterations)
        best = min(best, (time.perf_counter_ns() - start) / iterations)
    return best


def phases(iterations: int) -> None:
    for step in range(iterations):
        with probe.phase("forward", step=step):
            pass


def collectives(iterations: int) -> None:
    tensor = torch.zeros(16, 4096)
    for _ in range(iterations):
        with probe.collective("tp0", "all_reduce", [tensor]) as record:
            if record.skip:
                raise AssertionError("no fault is armed")


def cuda_collectives(iterations: int) -> None:
    tensor = torch.zeros(16, 4096, device="cuda")
    for _ in range(iterations):
        with probe.collective("tp0", "all_reduce", [tensor]):
            pass
    torch.cuda.synchronize()


def counter_writes(iterations: int) -> None:
    """The host-mapped counter: one kernel launch per traced collective."""
    from kernels.progress import write_counter
    counter = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    for n in range(iterations):
        write_counter(counter, n)
    torch.cuda.synchronize()


def empty_loop(iterations: int) -> None:
    for _ in range(iterations):
        pass


def measure(iterations: int) -> dict[str, float]:
    loop = per_call_ns(empty_loop, iterations)
    results = {"phase_off_ns": per_call_ns(phases, iterations) - loop,
               "collective_off_ns": per_call_ns(collectives, iterations) - loop}
    run_dir = tempfile.mkdtemp(prefix="probe-bench-")
    try:
        os.environ[probe.RUN_DIR_VAR] = run_dir
        cuda = torch.cuda.is_available()
        probe.init("worker", rank=0, world_size=1, device="cuda:0" if cuda else "cpu")
        results["phase_on_ns"] = per_call_ns(phases, iterations) - loop
        results["collective_on_ns"] = per_call_ns(collectives, iterations) - loop
        if cuda:
            results["cuda_collective_on_ns"] = per_call_ns(cuda_collectives, iterations) - loop
            results["counter_kernel_ns"] = per_call_ns(counter_writes, iterations) - loop
    finally:
        shutil.rmtree(run_dir)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=100_000)
    parser.add_argument("--json", default="probe_overhead.json", help="where to write the numbers")
    args = parser.parse_args()
    results = measure(args.iterations)
    print(f"{'call':<24}{'off (ns)':>10}{'on (ns)':>10}{'added (ns)':>12}")
    for name, label in (("phase", "phase marker"), ("collective", "traced collective")):
        off, on = results[f"{name}_off_ns"], results[f"{name}_on_ns"]
        print(f"{label:<24}{off:>10.0f}{on:>10.0f}{on - off:>12.0f}")
    if "cuda_collective_on_ns" in results:
        print(f"traced collective, CUDA tensor (2 events): {results['cuda_collective_on_ns']:.0f} ns")
        print(f"host-mapped counter kernel per call:      {results['counter_kernel_ns']:.0f} ns")
    with open(args.json, "w") as out:
        json.dump({"iterations": args.iterations, "python": platform.python_version(),
                   "machine": platform.processor() or platform.machine(), **results}, out,
                  indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
