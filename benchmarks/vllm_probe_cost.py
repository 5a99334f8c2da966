"""What diag costs real vLLM: vLLM's own benchmark client against `vllm serve`
(its CPU build, .venv-vllm from ./setup.sh --tests) with and without `diag
launch` around it, side by side in one run.

    python benchmarks/vllm_probe_cost.py [-tp 2] [--rounds 2] [--num-prompts 64]
        [-o benchmarks/results/vllm_probe_cost_cpu.json]

Rounds alternate plain and diag, so the machine's drift falls on both sides.
Each round starts a server (a tiny Llama, tests/vllm_env/make_tiny_llama.py),
runs `vllm bench serve` on it (random prompts, fixed lengths, --ignore-eos)
and stops it. The table gives each round and the ratio diag / plain of the
medians; the JSON keeps vLLM's own result of every round.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.vllm_serving import VLLM, Server, make_checkpoint, serve_command  # noqa: E402
from helpers.run import free_port  # noqa: E402

METRICS = (("output_throughput", "out tok/s"), ("median_itl_ms", "ITL p50 ms"),
           ("median_ttft_ms", "TTFT p50 ms"))


def one_round(mode: str, checkpoint: Path, cache: Path, work: Path, args) -> dict:
    port = free_port()
    command = serve_command(checkpoint, port, args.tp, 1)
    if mode == "diag":
        command = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                   str(work / f"run-{port}"), "--", *command]
    server = Server.start(command, port, cache, args.tp, work / f"{mode}-{port}.log",
                          tidy_shm=mode == "plain")
    return server.bench_then_stop(checkpoint, work / f"{mode}-{port}.json", args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-tp", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("-o", "--output", default="benchmarks/results/vllm_probe_cost_cpu.json")
    args = parser.parse_args()
    if not VLLM.exists():
        sys.exit("vllm_probe_cost.py: real vLLM is not installed here: run ./setup.sh --tests")
    work = Path(tempfile.mkdtemp(prefix="vllm-cost-"))
    checkpoint, cache = make_checkpoint(work / "tiny-llama"), work / "cache"
    rounds = []
    for index in range(args.rounds):
        for mode in ("plain", "diag") if index % 2 == 0 else ("diag", "plain"):
            result = one_round(mode, checkpoint, cache, work, args)
            rounds.append({"round": index, "mode": mode, **{k: result[k] for k, _ in METRICS}})
            print(f"round {index} {mode}: " + ", ".join(
                f"{label} {result[key]:.1f}" for key, label in METRICS), flush=True)
    summary = {key: {mode: statistics.median(r[key] for r in rounds if r["mode"] == mode)
                     for mode in ("plain", "diag")} for key, _ in METRICS}
    for values in summary.values():
        values["ratio"] = values["diag"] / values["plain"]
    show(rounds, summary)
    Path(args.output).write_text(json.dumps(
        {"args": vars(args), "machine": platform.platform(), "rounds": rounds,
         "summary": summary}, indent=1))
    print(f"wrote {args.output}")


def show(rounds: list[dict], summary: dict) -> None:
    table = Table(title="vLLM serve, plain vs under diag launch")
    table.add_column("round")
    table.add_column("mode")
    for _, label in METRICS:
        table.add_column(label, justify="right")
    for r in rounds:
        table.add_row(str(r["round"]), r["mode"], *(f"{r[key]:.1f}" for key, _ in METRICS))
    table.add_row("median", "diag / plain", *(f"{summary[key]['ratio']:.3f}" for key, _ in METRICS))
    Console().print(table)


if __name__ == "__main__":
    main()
