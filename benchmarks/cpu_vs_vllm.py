"""This engine against vLLM's CPU build on the CPU: vLLM's own benchmark client
(`vllm bench serve`, from .venv-vllm: ./setup.sh --tests) against `python -m
engine serve` and against `vllm serve`, both serving the same tiny Llama
checkpoint (tests/vllm_env/make_tiny_llama.py, bfloat16 on disk) at tp=1, one
after the other in one run.

    python benchmarks/cpu_vs_vllm.py [--rounds 2] [--systems vllm:bfloat16,engine:bfloat16]
        [--baseline DIR] [-o benchmarks/results/cpu_vs_vllm.json]

A system is NAME:DTYPE, the dtype passed as --dtype: `vllm`, `engine` (this
checkout), `engine-sync` (this checkout with --no-async-scheduling) or
`baseline` (the engine of another checkout, --baseline DIR, e.g. the commit
before a change: git archive COMMIT | tar -x -C DIR). Rounds
alternate the order of the systems, so the machine's drift falls on all of
them. Each round starts a server, runs the client once (random prompts of
fixed lengths, --ignore-eos) and stops it. The table gives every round, the
medians, and each system's medians over vLLM's.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.vllm_serving import REPO, VLLM, Server, make_checkpoint  # noqa: E402
from helpers.run import free_port  # noqa: E402

METRICS = (("output_throughput", "out tok/s"), ("median_itl_ms", "ITL p50 ms"),
           ("median_ttft_ms", "TTFT p50 ms"), ("median_tpot_ms", "TPOT p50 ms"))
KEPT = ("completed", "duration", "total_output_tokens", "request_throughput", "p99_itl_ms",
        "p99_ttft_ms", "mean_itl_ms")
NAMES = ("vllm", "engine", "engine-sync", "baseline")
DTYPES = ("auto", "float32", "bfloat16", "float16")
MAX_MODEL_LEN = 512


@dataclass(frozen=True)
class System:
    name: str     # vllm, engine or baseline
    dtype: str

    @property
    def label(self) -> str:
        return f"{self.name}:{self.dtype}"


def parse_systems(spec: str) -> list[System]:
    systems = []
    for item in spec.split(","):
        name, _, dtype = item.partition(":")
        if name not in NAMES or dtype not in DTYPES:
            raise ValueError(f"--systems: {item!r} is not NAME:DTYPE with NAME in {', '.join(NAMES)} "
                             f"and DTYPE in {', '.join(DTYPES)}")
        systems.append(System(name, dtype))
    if len(set(systems)) != len(systems):
        raise ValueError(f"--systems names a system twice: {spec!r}")
    return systems


def serve_command(system: System, checkpoint: Path, port: int, max_num_seqs: int) -> list[str]:
    common = ["--served-model-name", "tiny", "--host", "127.0.0.1", "--port", str(port),
              "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(max_num_seqs),
              "--dtype", system.dtype]
    if system.name == "vllm":
        return [str(VLLM), "serve", str(checkpoint), *common]
    sync = ["--no-async-scheduling"] if system.name == "engine-sync" else []
    return [sys.executable, "-m", "engine", "serve", "--model", str(checkpoint), *common, *sync]


def one_round(system: System, checkpoint: Path, work: Path, args) -> dict:
    port = free_port()
    cwd = Path(args.baseline) if system.name == "baseline" else REPO
    log = work / f"{system.name}-{system.dtype}-{port}.log"
    server = Server.start(serve_command(system, checkpoint, port, args.max_num_seqs), port,
                          work / "cache", 1, log, cwd=cwd, tidy_shm=system.name == "vllm")
    return server.bench_then_stop(checkpoint, work / f"{system.name}-{system.dtype}-{port}.json", args)


def summarize(rounds: list[dict], systems: list[System]) -> dict:
    summary = {}
    for system in systems:
        mine = [r for r in rounds if r["system"] == system.label]
        summary[system.label] = {key: statistics.median(r[key] for r in mine) for key, _ in METRICS}
    reference = next((s.label for s in systems if s.name == "vllm"), None)
    for label, values in summary.items():
        if reference is not None:
            values["over_vllm"] = {key: values[key] / summary[reference][key] for key, _ in METRICS}
            values["tok_s_over_vllm_by_round"] = by_round(rounds, label, reference)
    return summary


def by_round(rounds: list[dict], label: str, reference: str) -> list[float]:
    """Output tok/s over vLLM's in the same round, round by round."""
    theirs = {r["round"]: r["output_throughput"] for r in rounds if r["system"] == reference}
    return [r["output_throughput"] / theirs[r["round"]] for r in rounds if r["system"] == label]


def show(rounds: list[dict], summary: dict) -> None:
    table = Table(title="vllm bench serve against each server, tp=1, CPU")
    for column in ("round", "system", *(label for _, label in METRICS)):
        table.add_column(column, justify="left" if column == "system" else "right")
    for r in rounds:
        table.add_row(str(r["round"]), r["system"], *(f"{r[key]:.1f}" for key, _ in METRICS))
    for label, values in summary.items():
        table.add_row("median", label, *(f"{values[key]:.1f}" for key, _ in METRICS))
    ratios = [(label, values["over_vllm"]) for label, values in summary.items()
              if "over_vllm" in values and not label.startswith("vllm:")]
    for label, over in ratios:
        table.add_row("/ vLLM", label, *(f"{over[key]:.3f}" for key, _ in METRICS))
    Console(width=120).print(table)
    if ratios:
        print("out tok/s over vLLM above 1 is faster than vLLM; ITL, TTFT and TPOT below 1 are.")
    for label, values in summary.items():
        each = values.get("tok_s_over_vllm_by_round")
        if each and not label.startswith("vllm:"):
            print(f"{label}: out tok/s over vLLM's, round by round: "
                  f"{', '.join(f'{x:.3f}' for x in each)} (spread {min(each):.3f}-{max(each):.3f})")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default="vllm:bfloat16,engine:bfloat16",
                        help="comma-separated NAME:DTYPE (NAME: vllm, engine, engine-sync, baseline)")
    parser.add_argument("--baseline", help="another checkout whose engine runs as 'baseline'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--max-num-seqs", type=int, default=16, help="both servers' batch limit")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("-o", "--output", default="benchmarks/results/cpu_vs_vllm.json")
    args = parser.parse_args(argv)
    try:
        args.system_list = parse_systems(args.systems)
    except ValueError as error:
        parser.error(str(error))
    if any(s.name == "baseline" for s in args.system_list) and not (
            args.baseline and (Path(args.baseline) / "engine" / "__main__.py").is_file()):
        parser.error("a baseline system needs --baseline DIR, a checkout with engine/__main__.py")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    if not VLLM.exists():
        sys.exit("cpu_vs_vllm.py: real vLLM is not installed here: run ./setup.sh --tests")
    work = Path(tempfile.mkdtemp(prefix="cpu-vs-vllm-"))
    checkpoint = make_checkpoint(work / "tiny-llama")
    rounds = []
    for index in range(args.rounds):
        order = args.system_list if index % 2 == 0 else args.system_list[::-1]
        for system in order:
            result = one_round(system, checkpoint, work, args)
            rounds.append({"round": index, "system": system.label,
                           **{k: result[k] for k, _ in METRICS}, **{k: result.get(k) for k in KEPT}})
            print(f"round {index} {system.label}: " + ", ".join(
                f"{label} {result[key]:.1f}" for key, label in METRICS), flush=True)
    summary = summarize(rounds, args.system_list)
    show(rounds, summary)
    body = {"args": {k: v for k, v in vars(args).items() if k != "system_list"},
            "systems": [asdict(s) for s in args.system_list], "machine": platform.platform(),
            "max_model_len": MAX_MODEL_LEN, "rounds": rounds, "summary": summary}
    Path(args.output).write_text(json.dumps(body, indent=1))
    print(f"wrote {args.output}; each server's log and the client's results are in {work}")


if __name__ == "__main__":
    main()
