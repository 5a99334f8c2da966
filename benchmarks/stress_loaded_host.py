"""Healthy jobs and hangs on a host starved for CPU, with the stall limits that
stretch by the time a rank waited for a CPU and with the old limits
(`diag launch --cpu-stretch 1`), side by side.

    PYTHONPATH=. python benchmarks/stress_loaded_host.py [--runs 5] [--per-cpu 4]
        [--layout tp2pp4] [--cases healthy,hang,spin] [--json FILE]

Each run is the real engine (`python -m engine generate`, tiny-llama, gloo)
under `diag launch --on-hang kill`; from its first step to its end, PER_CPU
busy loops per CPU, each in a session of its own, take the cores
(tests/helpers/starve.py). The cases:

  healthy   long prompts in 32-token chunks (the fault matrix's chunked-prefill
            run): any verdict or a non-zero exit is a false alarm
  hang      rank 1 hangs in forward at step 4 (blocked): the verdict must be
            stuck_in_phase [1], and its detection time is kept
  spin      the same, but rank 1 loops on the CPU (kind=spin): it waits for a
            core as a healthy rank does, so its limit stretches (at most 10x)

Prints a table per case and limits, and writes every run's outcome as JSON
(default benchmarks/results/stress_loaded_host.json).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from helpers.run import left_behind, wait_for  # noqa: E402
from helpers.starve import Starved  # noqa: E402

from diagnose.core.vocab import Phase  # noqa: E402
from diagnose.launch.collector import Collector  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "stress_loaded_host.json"
CULPRIT = 1
FAULTS = {"hang": f"rank={CULPRIT},at=forward,step=4,kind=hang",
          "spin": f"rank={CULPRIT},at=forward,step=4,kind=spin"}
CASES = ("healthy", "hang", "spin")
LIMITS = {"stretched": "10", "old": "1"}       # --cpu-stretch
RUN_TIMEOUT_S = 300


@dataclass
class Run:
    case: str
    limits: str
    exit_code: int | None
    verdicts: list[list]           # [kind, culprit ranks, detected_after_s]
    wall_s: float
    pressure: float | None         # PSI cpu "some" share while starved
    cpu_waited_s: float | None     # the culprit's wait for a CPU, where the evidence has it

    @property
    def right(self) -> bool:
        if self.case == "healthy":
            return self.exit_code == 0 and not self.verdicts
        return self.exit_code == 1 and [v[:2] for v in self.verdicts] == [["stuck_in_phase",
                                                                          [CULPRIT]]]


def engine(layout: str, case: str) -> list[str]:
    tp, pp = layout.removeprefix("tp").split("pp")
    command = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", tp,
               "-pp", pp, "--ignore-eos"]
    if case in FAULTS:
        return command + ["--prompt", "Where does the pipeline stop?", "--max-tokens", "32"]
    for i in range(8):
        command += ["--prompt", f"request {i}: " + "a long prompt that needs many chunks " * 4]
    return command + ["--max-tokens", "16", "--max-num-batched-tokens", "32",
                      "--max-num-seqs", "8"]


def run_one(root: str, index: int, case: str, limits: str, layout: str, per_cpu: int) -> Run:
    run_dir = os.path.join(root, f"{index:03d}-{case}-{limits}")
    fault = ["--fault", FAULTS[case]] if case in FAULTS else []
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                             run_dir, "--on-hang", "kill", "--cpu-stretch", LIMITS[limits],
                             *fault, "--", *engine(layout, case)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        collector = Collector(run_dir)
        wait_for(lambda: proc.poll() is not None or _stepping(collector),
                 timeout=RUN_TIMEOUT_S, what="the first step", every=0.2)
        with Starved(per_cpu) as starved:
            proc.wait(timeout=RUN_TIMEOUT_S)
            pressure = starved.pressure()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if left_behind(run_dir):
        raise SystemExit(f"processes of {run_dir} are still alive")
    report = json.loads(Path(run_dir, "report.json").read_text())
    verdicts = [[v["kind"], v["culprit_ranks"], v["detected_after_s"]] for v in report["verdicts"]]
    waits = [wait["cpu_waited_s"] for v in report["verdicts"]
             for wait in v["evidence"].get("cpu_wait", {}).values()]
    return Run(case, limits, proc.returncode, verdicts, round(time.monotonic() - began, 1),
               None if pressure is None else round(pressure, 3), max(waits, default=None))


def _stepping(collector: Collector) -> bool:
    return os.path.isdir(collector.run_dir) and any(event.name == Phase.EXECUTE_MODEL for state in collector.snapshot().ranks.values()
               for event in state.phases)


def table(runs: list[Run]) -> list[dict]:
    rows = []
    for case in CASES:
        for limits in LIMITS:
            mine = [run for run in runs if (run.case, run.limits) == (case, limits)]
            if not mine:
                continue
            detected = [v[2] for run in mine if run.right and case in FAULTS for v in run.verdicts]
            wrong = sorted({f"{v[0]} {v[1]}" for run in mine if not run.right
                            for v in run.verdicts} | {f"exit {run.exit_code}" for run in mine
                                                      if not run.right and not run.verdicts})
            rows.append({"case": case, "limits": limits, "runs": len(mine),
                         "right": sum(run.right for run in mine),
                         "detected_median_s": round(statistics.median(detected), 2)
                         if detected else None,
                         "detected_max_s": max(detected, default=None),
                         "pressure_median": statistics.median(
                             [run.pressure for run in mine if run.pressure is not None] or [0]),
                         "wall_median_s": statistics.median(run.wall_s for run in mine),
                         "wrong": wrong})
    return rows


def print_table(rows: list[dict]) -> None:
    print(f"{'case':8} {'limits':10} {'runs':>4} {'right':>5} {'detect med':>10} "
          f"{'detect max':>10} {'PSI some':>8} {'wall med':>8}  wrong verdicts")
    for row in rows:
        med, top = row["detected_median_s"], row["detected_max_s"]
        print(f"{row['case']:8} {row['limits']:10} {row['runs']:>4} {row['right']:>5} "
              f"{'-' if med is None else f'{med:.1f} s':>10} "
              f"{'-' if top is None else f'{top:.1f} s':>10} "
              f"{row['pressure_median']:>8.2f} {row['wall_median_s']:>6.0f} s  "
              f"{', '.join(row['wrong']) or '-'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each case and limits")
    parser.add_argument("--per-cpu", type=int, default=4, help="busy loops per CPU")
    parser.add_argument("--layout", default="tp2pp4")
    parser.add_argument("--cases", default=",".join(CASES), help="of " + ", ".join(CASES))
    parser.add_argument("--json", default=str(RESULTS))
    args = parser.parse_args()
    if not set(args.cases.split(",")) <= set(CASES):
        parser.error(f"--cases: of {', '.join(CASES)}")
    root = tempfile.mkdtemp(prefix="stress-loaded-")
    runs: list[Run] = []
    for index in range(args.runs):
        for case in args.cases.split(","):
            for limits in LIMITS:
                runs.append(run_one(root, len(runs), case, limits, args.layout, args.per_cpu))
                print(f"[{len(runs)}/{args.runs * len(LIMITS) * len(args.cases.split(','))}] {asdict(runs[-1])}", file=sys.stderr,
                      flush=True)
    rows = table(runs)
    print_table(rows)
    Path(args.json).write_text(json.dumps({
        "machine": {"cpus": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "settings": {"runs": args.runs, "per_cpu": args.per_cpu, "layout": args.layout,
                     "faults": FAULTS, "run_dir": root},
        "table": rows, "runs": [asdict(run) | {"right": run.right} for run in runs]}, indent=1))
    if all(run.right for run in runs):
        shutil.rmtree(root, ignore_errors=True)
    else:
        print(f"the run dirs are kept in {root}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
