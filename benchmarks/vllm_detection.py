"""How fast diag names the culprit in real vLLM (its CPU build, .venv-vllm from
./setup.sh --tests), against vLLM's own signals for the same faults.

    python benchmarks/vllm_detection.py [--repeats 2] [-o benchmarks/results/vllm_detection_cpu.json]

Each case starts `diag launch --on-hang kill -- vllm serve` on a tiny Llama
(tests/vllm_env/make_tiny_llama.py), keeps one request in flight, injects the
fault (the probe plugin's --fault, or SIGKILL of a worker) and reads the
report: the verdict's kind and culprits, and detected_after_s, the seconds from
the stall (or the death) to the verdict. vLLM itself says "No available shared
memory broadcast block found in 60 seconds" after 60 s, naming no rank, and
ends the engine after VLLM_RPC_TIMEOUT (300 s by default) for the hangs; a
killed worker its executor notices itself, so there the table gives no ratio.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.collecting import collect  # noqa: E402
from helpers.vllm_serving import VLLM, Server, make_checkpoint, serve_command  # noqa: E402
from helpers.run import free_port  # noqa: E402

VLLM_WARNING_S, VLLM_TIMEOUT_S = 60.0, 300.0   # vLLM on a hang: a rank-less warning, then death


@dataclass
class Case:
    name: str
    tp: int
    pp: int
    fault: str | None          # a --fault spec, or None: SIGKILL rank `kill_rank`
    expected: tuple[str, list[int]]
    hang: bool = True          # vLLM's own signals are the warning and the timeout
    kill_rank: int = 1


CASES = [
    Case("tp2: rank 0 blocks before its 4th execute_model", 2, 1,
         "rank=0,at=execute_model,step=3,kind=hang", ("never_reached", [0])),
    Case("tp2 pp2: rank 3 blocks before its 2nd execute_model", 2, 2,
         "rank=3,at=execute_model,step=1,kind=hang", ("never_reached", [3])),
    Case("tp2: rank 1 SIGKILLed while serving", 2, 1, None, ("dead", [1]), hang=False),
]


@dataclass
class Outcome:
    case: str
    repeat: int
    kind: str | None
    culprits: list[int]
    right: bool
    detected_after_s: float | None
    verdicts: int
    exit_code: int


def run_case(case: Case, repeat: int, checkpoint: Path, cache: Path, work: Path) -> Outcome:
    port, run_dir = free_port(), work / f"run-{len(os.listdir(work))}"
    fault = ["--fault", case.fault] if case.fault else []
    command = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(run_dir),
               "--on-hang", "kill", *fault, "--", *serve_command(checkpoint, port, case.tp,
                                                                  case.pp)]
    server = Server.start(command, port, cache, case.tp * case.pp, work / f"{port}.log")
    stop, texts = threading.Event(), []
    try:
        server.wait_ready()
        server.keep_busy(stop, texts)
        if case.fault is None:
            while len(texts) < 2:
                time.sleep(0.2)
            os.kill(collect(str(run_dir)).ranks[case.kill_rank].identity.pid, 9)
        exit_code = server.finish(timeout=300)
    finally:
        stop.set()
    verdicts = json.loads((run_dir / "report.json").read_text())["verdicts"]
    first = verdicts[0] if verdicts else {}
    got = (first.get("kind"), first.get("culprit_ranks", []))
    return Outcome(case.name, repeat, got[0], got[1], got == case.expected and
                   all(v["culprit_ranks"] == case.expected[1] for v in verdicts),
                   first.get("detected_after_s"), len(verdicts), exit_code)


def show(outcomes: list[Outcome]) -> None:
    table = Table(title="diag on real vLLM: time to the right verdict")
    for column in ("case", "verdict", "right", "detected after s (each run)", "median s",
                   "sooner than vLLM's warning / timeout"):
        table.add_column(column)
    for case in CASES:
        runs = [o for o in outcomes if o.case == case.name]
        times = [o.detected_after_s for o in runs if o.detected_after_s is not None]
        median = statistics.median(times) if times else None
        sooner = (f"{VLLM_WARNING_S / median:.0f}x / {VLLM_TIMEOUT_S / median:.0f}x"
                  if median and case.hang else "-")
        table.add_row(case.name, f"{runs[0].kind} {runs[0].culprits}",
                      f"{sum(o.right for o in runs)}/{len(runs)}",
                      ", ".join(f"{t:.2f}" for t in times),
                      f"{median:.2f}" if median is not None else "-", sooner)
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("-o", "--output", default="benchmarks/results/vllm_detection_cpu.json")
    args = parser.parse_args()
    if not VLLM.exists():
        sys.exit("vllm_detection.py: real vLLM is not installed here: run ./setup.sh --tests")
    work = Path(tempfile.mkdtemp(prefix="vllm-detect-"))
    checkpoint, cache = make_checkpoint(work / "tiny-llama"), work / "cache"
    runs = work / "runs"
    runs.mkdir()
    outcomes = []
    for repeat in range(args.repeats):
        for case in CASES:
            outcomes.append(run_case(case, repeat, checkpoint, cache, runs))
            print(f"{case.name} (run {repeat}): {asdict(outcomes[-1])}", flush=True)
    show(outcomes)
    Path(args.output).write_text(json.dumps(
        {"schema_version": 1, "machine": platform.platform(), "cpus": os.cpu_count(),
         "load_average": os.getloadavg(), "outcomes": [asdict(o) for o in outcomes]},
        indent=1))
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
