"""python -m engine bench: offline throughput and latency, optionally swept over one flag.

All requests arrive at once with random prompt tokens and generate exactly
--output-len tokens each. Each LLMEngine.step() is timed: a request's time to first
token (TTFT) is from the start to the step that gave its first token, and its
inter-token latencies (ITL) are the gaps between the steps that gave the next ones.

    python -m engine bench --model llama-3.2-1b --sweep max-num-batched-tokens=512,2048,8192 \\
        -o sweep.json --plot sweep.png

A sweep prints each run's row on stderr as the run ends, then the table of all.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import time
from dataclasses import dataclass

import numpy as np
import torch

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine
from engine.sampling_params import SamplingParams

WARMUP_PROMPTS = 4
BAR_WIDTH = 20
SCHEMA_VERSION = 1      # of the JSON that --json prints and -o writes
COLUMNS = ["req/s", "out tok/s", "TTFT ms p50/p90/p99", "ITL ms p50/p90/p99"]


@dataclass
class Workload:
    num_prompts: int
    input_len: int
    output_len: int
    seed: int

    def validate(self) -> None:
        for flag, value in [("--num-prompts", self.num_prompts), ("--input-len", self.input_len),
                            ("--output-len", self.output_len)]:
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")


@dataclass
class Percentiles:
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values_s: list[float]) -> Percentiles | None:
        """Percentiles in milliseconds; None without samples."""
        if not values_s:
            return None
        return cls(*(float(v) * 1e3 for v in np.percentile(values_s, [50, 90, 99])))


@dataclass
class BenchResult:
    label: str                 # the swept flag's value, or "default"
    num_requests: int
    output_tokens: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_ms: Percentiles | None
    itl_ms: Percentiles | None


def random_prompts(num_prompts: int, input_len: int, vocab_size: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab_size, (num_prompts, input_len), generator=generator).tolist()


def measure(engine: LLMEngine, prompts: list[list[int]], output_len: int, label: str) -> BenchResult:
    """Run the prompts to completion; time every step."""
    params = SamplingParams(temperature=0.0, max_tokens=output_len, ignore_eos=True)
    start = time.perf_counter()
    token_times: dict[str, list[float]] = {engine.add_request(p, params): [] for p in prompts}
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            token_times[output.req_id] += [now] * len(output.new_token_ids)
    duration = time.perf_counter() - start
    ttfts = [times[0] - start for times in token_times.values() if times]
    itls = [later - earlier for times in token_times.values() for earlier, later in zip(times, times[1:])]
    output_tokens = sum(len(times) for times in token_times.values())
    return BenchResult(label, len(prompts), output_tokens, duration, len(prompts) / duration,
                       output_tokens / duration, Percentiles.of(ttfts), Percentiles.of(itls))


def run_bench(config: EngineConfig, workload: Workload, label: str) -> BenchResult:
    """Start an engine, warm it up on a few other prompts (kernel compilation), then measure."""
    engine = LLMEngine(config)
    try:
        if workload.input_len + workload.output_len > engine.max_model_len:
            raise ValueError(f"--input-len + --output-len is {workload.input_len + workload.output_len}; "
                             f"the context holds {engine.max_model_len} (--max-model-len)")
        vocab_size = engine.model_config.vocab_size
        warmup = random_prompts(WARMUP_PROMPTS, workload.input_len, vocab_size, workload.seed + 1)
        measure(engine, warmup, min(workload.output_len, 4), "warmup")
        prompts = random_prompts(workload.num_prompts, workload.input_len, vocab_size, workload.seed)
        return measure(engine, prompts, workload.output_len, label)
    finally:
        engine.shutdown()


def sweep_configs(config: EngineConfig, spec: str | None) -> list[tuple[str, EngineConfig]]:
    """`flag=v1,v2,...` over an integer engine flag -> one (value, config) per value."""
    if spec is None:
        return [("default", config)]
    flag, _, values = spec.partition("=")
    field = flag.removeprefix("--").replace("-", "_")
    int_fields = {f.name for f in dataclasses.fields(EngineConfig)
                  if f.type in ("int", "int | None")}
    if field not in int_fields:
        raise ValueError(f"--sweep {spec!r}: expected FLAG=V1,V2,... over an integer engine flag "
                         f"({', '.join(sorted(f.replace('_', '-') for f in int_fields))})")
    try:
        numbers = [int(v) for v in values.split(",")]
    except ValueError:
        raise ValueError(f"--sweep {spec!r}: the values must be integers, comma-separated") from None
    return [(str(n), dataclasses.replace(config, **{field: n})) for n in numbers]


# -- output -----------------------------------------------------------------------------

def _ms(value: float) -> str:
    return f"{value:.0f}" if value >= 100 else f"{value:.1f}"


def _fmt(p: Percentiles | None) -> str:
    return "-" if p is None else f"{_ms(p.p50)}/{_ms(p.p90)}/{_ms(p.p99)}"


def _swept_flag(sweep: str | None) -> str | None:
    return sweep.partition("=")[0].removeprefix("--") if sweep else None


def _title(text: str, sweep: str | None) -> str:
    return f"{text}, sweep of {_swept_flag(sweep)}" if sweep else text


def _row(r: BenchResult) -> list[str]:
    """The values of COLUMNS."""
    return [f"{r.requests_per_s:.2f}", f"{r.output_tokens_per_s:.1f}", _fmt(r.ttft_ms), _fmt(r.itl_ms)]


def print_table(results: list[BenchResult], sweep: str | None, console) -> None:
    from rich.table import Table

    table = Table(title=_title("engine bench", sweep))
    for column in ["value" if sweep else "run", *COLUMNS]:
        table.add_column(column, justify="right", no_wrap=True)
    for r in results:
        table.add_row(r.label, *_row(r))
    console.print(table)


def run_line(result: BenchResult, index: int, runs: int, sweep: str, seconds: float) -> str:
    """One sweep run's row, printed as it ends."""
    cells = ", ".join(f"{column} {value}" for column, value in zip(COLUMNS, _row(result)))
    return f"run {index}/{runs}, {_swept_flag(sweep)}={result.label}: {cells} ({seconds:.1f} s)"


def print_terminal_plot(results: list[BenchResult], sweep: str | None, console) -> None:
    """Bars of TTFT p50 and ITL p50 per run, each scaled to its largest."""
    from rich.table import Table

    table = Table(title=_title("p50 latency", sweep), show_edge=False)
    table.add_column("value" if sweep else "run", justify="right", no_wrap=True)
    table.add_column("TTFT p50", no_wrap=True)
    table.add_column("ITL p50", no_wrap=True)
    ttft_max = max((r.ttft_ms.p50 for r in results if r.ttft_ms), default=0.0) or 1.0
    itl_max = max((r.itl_ms.p50 for r in results if r.itl_ms), default=0.0) or 1.0

    def bar(p: Percentiles | None, largest: float, colour: str) -> str:
        if p is None:
            return "-"
        return f"[{colour}]{'█' * max(1, round(BAR_WIDTH * p.p50 / largest))}[/] {_ms(p.p50)} ms"

    for r in results:
        table.add_row(r.label, bar(r.ttft_ms, ttft_max, "cyan"), bar(r.itl_ms, itl_max, "magenta"))
    console.print(table)


def write_plot(results: list[BenchResult], sweep: str | None, path: str) -> bool:
    """TTFT and ITL percentiles per run as a PNG; False when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r.label for r in results]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, title, key in [(axes[0], "TTFT (ms)", "ttft_ms"), (axes[1], "ITL (ms)", "itl_ms")]:
        for pct, marker in [("p50", "o"), ("p90", "s"), ("p99", "^")]:
            values = [getattr(getattr(r, key), pct) if getattr(r, key) else float("nan") for r in results]
            ax.plot(labels, values, marker=marker, label=pct)
        ax.set_title(title)
        ax.legend()
    axes[2].bar(labels, [r.output_tokens_per_s for r in results])
    axes[2].set_title("output tokens/s")
    for ax in axes:
        ax.set_xlabel(_swept_flag(sweep) or "run")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def results_json(config: EngineConfig, workload: Workload, sweep: str | None,
                 results: list[BenchResult]) -> dict:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() and config.device != "cpu" else "cpu"
    return {"schema_version": SCHEMA_VERSION, "model": config.model, "device": device,
            "engine_config": dataclasses.asdict(config), "workload": dataclasses.asdict(workload),
            "sweep": sweep, "results": [dataclasses.asdict(r) for r in results]}


# -- command line -----------------------------------------------------------------------

def _output(path: str | None):
    if path is None:
        return contextlib.nullcontext()
    try:
        return open(path, "w")
    except OSError as error:
        raise ValueError(f"-o {path}: {error.strerror}") from None


def _run_all(runs: list[tuple[str, EngineConfig]], workload: Workload,
             sweep: str | None) -> list[BenchResult]:
    results = []
    for index, (label, run_config) in enumerate(runs, 1):
        started = time.perf_counter()
        results.append(run_bench(run_config, workload, label))
        if sweep:
            print(run_line(results[-1], index, len(runs), sweep, time.perf_counter() - started),
                  file=sys.stderr, flush=True)
    return results


def bench_main(args: argparse.Namespace, config: EngineConfig) -> int:
    """The bench of the command line's args, on the engine flags' `config`."""
    from rich.console import Console

    config.validate()
    workload = Workload(args.num_prompts, args.input_len, args.output_len, config.seed)
    workload.validate()
    runs = sweep_configs(config, args.sweep)
    for _, run_config in runs:
        run_config.validate()
    with _output(args.output) as output:   # opened first: a bad path fails before the runs
        results = _run_all(runs, workload, args.sweep)
        report = results_json(config, workload, args.sweep, results)
        if output:
            json.dump(report, output, indent=2)

    console = Console(stderr=args.json)    # with --json, stdout carries only the JSON
    print_table(results, args.sweep, console)
    print_terminal_plot(results, args.sweep, console)
    if args.output:
        console.print(f"wrote {args.output}")
    if args.plot:
        if write_plot(results, args.sweep, args.plot):
            console.print(f"wrote {args.plot}")
        else:
            print(f"note: matplotlib is not installed, so no plot was written to {args.plot} "
                  "(pip install matplotlib); the table and terminal plot above have the numbers",
                  file=sys.stderr)
    if args.json:
        print(json.dumps(report, indent=2))
    return 0
