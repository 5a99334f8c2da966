"""`diag attach` on healthy real vLLM (its CPU build, .venv-vllm from ./setup.sh
--tests) at work, many times over: every verdict and every exit but 0 is a false
alarm, and the aim is none.

    python benchmarks/attach_healthy_stress.py [--attaches 10] [--layouts NAMES] \
        [-o benchmarks/results/attach_healthy_stress.json]

Each layout starts `vllm serve` without diag on a tiny Llama, keeps requests
coming one after another (plus, with --load, one busy-loop process per core),
and attaches `--attaches` times, 1 s apart. A rank that waits in a collective
with the same Python frames in every dump counts as spinning in the wait, not
as moving (diagnose/attach/sample.py): a healthy rank whose samples all fall
in the same collective's call site must still not be named. Prints a table per
layout and writes every attach's outcome as JSON.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers.run import DIAG, free_port  # noqa: E402
from helpers.vllm_serving import Server, make_checkpoint, serve_command  # noqa: E402

LAYOUTS = {"tp2": (2, 1, ()), "tp2-eager": (2, 1, ("--enforce-eager",)),
           "tp2pp2": (2, 2, ()), "tp2pp2-eager": (2, 2, ("--enforce-eager",))}
READY_S = 900.0


@dataclass
class Attach:
    layout: str
    loaded: bool
    exit_code: int
    seconds: float
    verdicts: list[str]
    moving: list
    answers_before: int

    @property
    def false_alarm(self) -> bool:
        return self.exit_code != 0 or bool(self.verdicts)


def attach_once(pid: int, run_dir: Path) -> tuple[int, float, dict]:
    start = time.monotonic()
    done = subprocess.run([*DIAG, "attach", str(pid), "--run-dir", str(run_dir), "--json"],
                          capture_output=True, text=True, timeout=300)
    took = time.monotonic() - start
    try:
        body = json.loads(done.stdout)
    except ValueError:
        body = {"verdicts": [], "attach": {"moving": []}, "stderr": done.stderr[-500:]}
    return done.returncode, took, body


def busy_loop(stop) -> None:
    while not stop.is_set():
        pass


def run_layout(name: str, args, checkpoint: Path, cache: Path, work: Path) -> list[Attach]:
    tp, pp, extra = LAYOUTS[name]
    port = free_port()
    server = Server.start(serve_command(checkpoint, port, tp, pp, extra), port, cache,
                          tp * pp, work / f"{name}.log", tidy_shm=True)
    stop, texts, outcomes = threading.Event(), [], []
    burners, burn = [], multiprocessing.Event()
    try:
        server.wait_ready(READY_S)
        server.keep_busy(stop, texts)
        while not texts:
            time.sleep(0.2)
        if args.load:
            burners = [multiprocessing.Process(target=busy_loop, args=(burn,))
                       for _ in range(os.cpu_count() or 1)]
            for burner in burners:
                burner.start()
        for index in range(args.attaches):
            code, took, body = attach_once(server.process.pid, work / f"{name}-{index}")
            verdicts = [f"{v['kind']}: {v['summary']}" for v in body.get("verdicts", [])]
            outcomes.append(Attach(name, args.load, code, round(took, 2), verdicts,
                                   body.get("attach", {}).get("moving", []), len(texts)))
            print(f"{name} attach {index}: exit {code}, {took:.1f} s, {verdicts or 'no verdict'}",
                  flush=True)
            time.sleep(1.0)
    finally:
        burn.set()
        for burner in burners:
            burner.join()
        stop.set()
        server.interrupt()
        server.finish()
    return outcomes


def table(outcomes: list[Attach]) -> Table:
    grid = Table(title="diag attach on healthy vLLM at work: false alarms")
    for column in ("layout", "attaches", "false alarms", "attach s (median)", "answers"):
        grid.add_column(column)
    for name in dict.fromkeys(o.layout for o in outcomes):
        rows = [o for o in outcomes if o.layout == name]
        times = sorted(o.seconds for o in rows)
        grid.add_row(name, str(len(rows)), str(sum(o.false_alarm for o in rows)),
                     f"{times[len(times) // 2]:.1f}", str(rows[-1].answers_before))
    return grid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attaches", type=int, default=10)
    parser.add_argument("--layouts", default="tp2,tp2-eager,tp2pp2")
    parser.add_argument("--load", action="store_true", help="one busy loop per core as well")
    parser.add_argument("-o", "--output", default="benchmarks/results/attach_healthy_stress.json")
    args = parser.parse_args()
    outcomes: list[Attach] = []
    with tempfile.TemporaryDirectory(prefix="attach-stress-") as tmp:
        work = Path(tmp)
        checkpoint = make_checkpoint(work / "tiny-llama")
        for name in args.layouts.split(","):
            outcomes += run_layout(name, args, checkpoint, work / "cache", work)
    Console().print(table(outcomes))
    alarms = [o for o in outcomes if o.false_alarm]
    Path(args.output).write_text(json.dumps({
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(sys.argv), "false_alarms": len(alarms),
        "attaches": [asdict(o) for o in outcomes]}, indent=1))
    return 1 if alarms else 0


if __name__ == "__main__":
    sys.exit(main())
