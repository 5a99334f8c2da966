"""Healthy jobs under `diag launch --on-hang kill`, many times over: every verdict
and every non-zero exit is a false alarm, and the aim is none.

    PYTHONPATH=. python benchmarks/stress_healthy.py [--jobs 200] [--gpu]
        [--load both|on|off] [--only PREFIX] [--timeout 600] [--budget-s S] [--json FILE]

The jobs cycle through these kinds:

  engine tp1pp1, tp2pp1, tp1pp2, tp2pp2   `python -m engine generate` on tiny-llama,
                                          a few tokens (with --gpu: `bench` on
                                          llama-3.2-1b, dummy weights, bfloat16, at
                                          the layouts the GPUs allow)
  torchrun                                tests/programs/dp_train.py, 2 ranks, gloo
  instant                                 a command that exits at once
  child first                             `sh -c 'probe-carrying driver; sleep 1'`:
                                          the command exits 0 after its driver did

With --load both (the default), the first half runs unloaded and the second
with one busy-loop process per core. Prints a table per kind and load, and
writes every job's outcome as JSON (default benchmarks/results/
stress_healthy_cpu.json, or _gpu.json with --gpu). The run dirs of failed jobs
are kept and named.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "programs")
PYTHON = sys.executable
RESULTS = os.path.join(REPO, "benchmarks", "results")


@dataclass
class Kind:
    name: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class Result:
    kind: str
    loaded: bool
    exit_code: int | None          # None: still running at the timeout (then stopped)
    verdicts: list[str]            # "kind: summary" of every verdict of report.json
    seconds: float
    run_dir: str | None = None     # kept when the job failed

    @property
    def failed(self) -> bool:
        return self.exit_code != 0 or bool(self.verdicts)


def engine(args: list[str]) -> list[str]:
    return [PYTHON, "-m", "engine", *args]


def cpu_kinds() -> list[Kind]:
    layouts = [(1, 1), (2, 1), (1, 2), (2, 2)]
    generate = ["generate", "--model", "tiny-llama", "--prompt", "Is this run healthy?",
                "--max-tokens", "8", "--ignore-eos"]
    return [Kind(f"engine tp{tp}pp{pp}", engine(generate + ["-tp", str(tp), "-pp", str(pp)]))
            for tp, pp in layouts] + common_kinds()


def gpu_kinds() -> list[Kind]:
    import torch
    gpus = torch.cuda.device_count()
    layouts = [(tp, pp) for tp, pp in [(1, 1), (2, 1), (1, 2), (2, 2)] if tp * pp <= gpus]
    bench = ["bench", "--model", "llama-3.2-1b", "--load-format", "dummy", "--dtype", "bfloat16",
             "--num-prompts", "32", "--input-len", "128", "--output-len", "256",
             "--max-num-seqs", "64", "--max-model-len", "1024"]   # the shape the exit race showed in
    return [Kind(f"engine bench tp{tp}pp{pp}", engine(bench + ["-tp", str(tp), "-pp", str(pp)]))
            for tp, pp in layouts] + common_kinds()


def common_kinds() -> list[Kind]:
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--monitor-interval", "0.5", "--master-port", "{port}",
                os.path.join(PROGRAMS, "dp_train.py")]
    driver = f"{PYTHON} {os.path.join(PROGRAMS, 'ending.py')} clean"
    return [Kind("torchrun", torchrun, {"TOY_STEPS": "20"}),
            Kind("instant", ["true"]),
            Kind("child first", ["sh", "-c", f"{driver}; sleep 1"])]


def run_job(kind: Kind, loaded: bool, root: str, index: int, timeout_s: float) -> Result:
    run_dir = os.path.join(root, f"job-{index:04d}")
    command = [arg.replace("{port}", str(free_port())) for arg in kind.command]
    env = dict(os.environ, **kind.env,
               PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    launcher = subprocess.Popen([PYTHON, "-m", "diagnose.cli", "launch", "--run-dir", run_dir,
                                 "--on-hang", "kill", "--", *command], cwd=REPO, env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        exit_code = launcher.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        launcher.send_signal(signal.SIGTERM)
        launcher.wait()
        exit_code = None
    result = Result(kind.name, loaded, exit_code, verdicts_of(run_dir),
                    round(time.monotonic() - started, 2))
    if result.failed:
        result.run_dir = run_dir
    else:
        shutil.rmtree(run_dir, ignore_errors=True)
    return result


def verdicts_of(run_dir: str) -> list[str]:
    try:
        with open(os.path.join(run_dir, "report.json")) as source:
            report = json.load(source)
    except (OSError, ValueError):
        return ["no readable report.json"]
    return [f"{verdict['kind']}: {verdict['summary']}" for verdict in report["verdicts"]]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"


class Load:
    """One busy-loop process per core while the block runs (each ends with us)."""

    def __enter__(self) -> Load:
        self.procs = [subprocess.Popen([PYTHON, "-c", BUSY_LOOP])
                      for _ in range(os.cpu_count() or 1)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()


def run_all(kinds: list[Kind], jobs: int, loads: list[bool], timeout_s: float,
            budget_s: float) -> list[Result]:
    """Each load gets its share of the jobs and of the budget: no job starts past it."""
    root = tempfile.mkdtemp(prefix="stress-healthy-")
    results = []
    per_load = [jobs // len(loads) + (i < jobs % len(loads)) for i in range(len(loads))]
    for loaded, count in zip(loads, per_load):
        ends = time.monotonic() + budget_s / len(loads)
        with Load() if loaded else nullcontext():
            for _ in range(count):
                if time.monotonic() > ends:
                    break
                kind = kinds[len(results) % len(kinds)]
                results.append(run_job(kind, loaded, root, len(results), timeout_s))
                print(_progress(results[-1], len(results), jobs), file=sys.stderr, flush=True)
    if not any(result.failed for result in results):
        shutil.rmtree(root, ignore_errors=True)
    return results


def _progress(result: Result, done: int, jobs: int) -> str:
    load = "loaded" if result.loaded else "unloaded"
    verdict = f" {result.verdicts[0]}" if result.verdicts else ""
    return (f"[{done}/{jobs}] {result.kind} ({load}): exit {result.exit_code}, "
            f"{result.seconds:.1f} s{verdict}")


def summarize(results: list[Result]) -> list[dict]:
    rows = defaultdict(list)
    for result in results:
        rows[(result.kind, result.loaded)].append(result)
    return [{"kind": kind, "loaded": loaded, "jobs": len(group),
             "with_verdicts": sum(bool(r.verdicts) for r in group),
             "nonzero_exits": sum(r.exit_code != 0 for r in group),
             "mean_s": round(sum(r.seconds for r in group) / len(group), 2)}
            for (kind, loaded), group in rows.items()]


def print_table(rows: list[dict]) -> None:
    line = "{:<22} {:<9} {:>5} {:>9} {:>10} {:>8}"
    print(line.format("kind", "load", "jobs", "verdicts", "exit != 0", "mean s"))
    for row in rows:
        print(line.format(row["kind"], "loaded" if row["loaded"] else "unloaded", row["jobs"],
                          row["with_verdicts"], row["nonzero_exits"], f"{row['mean_s']:.1f}"))
    print(line.format("all", "", *(sum(row[key] for row in rows)
                                   for key in ("jobs", "with_verdicts", "nonzero_exits")), ""))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--gpu", action="store_true", help="the engine's GPU bench layouts")
    parser.add_argument("--load", choices=["both", "on", "off"], default="both")
    parser.add_argument("--only", metavar="PREFIX", help="only the kinds whose name starts so")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument("--budget-s", type=float, default=math.inf,
                        help="no job starts after this many seconds (split over the loads)")
    parser.add_argument("--json", help="default: benchmarks/results/stress_healthy_{cpu,gpu}.json")
    args = parser.parse_args()
    kinds = [kind for kind in (gpu_kinds() if args.gpu else cpu_kinds())
             if kind.name.startswith(args.only or "")]
    if not kinds:
        parser.error(f"no kind starts with {args.only!r}")
    loads = {"both": [False, True], "on": [True], "off": [False]}[args.load]
    started = time.time()
    results = run_all(kinds, args.jobs, loads, args.timeout, args.budget_s)
    rows = summarize(results)
    print_table(rows)
    failed = [asdict(result) for result in results if result.failed]
    for result in failed:
        print(f"FAILED {result['kind']}: exit {result['exit_code']}, {result['verdicts'][:1]}, "
              f"run dir {result['run_dir']}")
    path = args.json or os.path.join(RESULTS, f"stress_healthy_{'gpu' if args.gpu else 'cpu'}.json")
    with open(path, "w") as sink:
        json.dump({"host": platform.node(), "cores": os.cpu_count(), "started": started,
                   "seconds": round(time.time() - started, 1), "rows": rows, "failed": failed,
                   "jobs": [asdict(result) for result in results]}, sink, indent=1)
    print(f"wrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
