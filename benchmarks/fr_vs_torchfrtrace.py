"""`diag analyze` beside PyTorch's own Flight Recorder analyzer (torchfrtrace,
`python -m torch.distributed.flight_recorder.fr_trace`) on the same dumps.

    PYTHONPATH=. python benchmarks/fr_vs_torchfrtrace.py [--ranks 1024,4096,16384]
        [--entries 64] [--timeout-s 1800] [--json benchmarks/results/fr_vs_torchfrtrace.json]

For each size, a serving job of tp=8 x pp=8 x dp=RANKS/64 hangs in one of three
ways (diagnose/offline/synth_fr_serving.py: a rank missing from its TP
all_reduce, a rank whose all_reduce has another size, a stage that stalls before
its send), and every rank's dump is written in torch's format, each ring
wrapped. Both tools then run on the same directory, each in a child process:
wall time, CPU and peak RSS come from the child's rusage (os.wait4). A tool
names the culprit when the ranks it blames are the planted rank alone: diag's
verdicts' culprit ranks; torchfrtrace's "missing ranks" and "Culprit rank" lines.
Prints a table and writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

from diagnose.offline.synth_fr_serving import FAULTS, Layout, write_serving_fr_dumps

PREFIX = "nccl_trace_rank_"
TP, PP = 8, 8
BLAMED = re.compile(r"missing ranks: \{([\d, ]*)\}|Culprit rank (\d+)")


@dataclass
class Run:
    wall_s: float | None       # None: it ran past the timeout and was stopped
    cpu_s: float
    max_rss_mb: float
    exit_code: int | None
    blamed: list[int]          # the ranks it names as culprit or missing
    names_culprit: bool        # blamed == [culprit]


@dataclass
class Case:
    ranks: int
    fault: str
    culprit: int
    dump_mb: float
    write_s: float
    diag: Run
    torchfrtrace: Run

    @property
    def speedup(self) -> float | None:
        if self.diag.wall_s is None:
            return None
        return (self.torchfrtrace.wall_s or float("inf")) / self.diag.wall_s


def measure(argv: list[str], timeout_s: float, keep_stderr: bool = False, cwd: str | None = None,
            env: dict | None = None) -> tuple[str, float | None, float, float, int | None]:
    """(its output, wall s or None past the timeout, CPU s, max RSS MB, exit code)."""
    start = time.perf_counter()
    with tempfile.TemporaryFile() as sink:
        child = subprocess.Popen(argv, stdout=sink, stderr=subprocess.STDOUT if keep_stderr
                                 else subprocess.DEVNULL,
                                 start_new_session=True, cwd=cwd, env=env)
        deadline = start + timeout_s
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                os.killpg(child.pid, signal.SIGKILL)
                _, status, usage = os.wait4(child.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - start
        timed_out = wall > timeout_s
        sink.seek(0)
        output = sink.read().decode(errors="replace")
    code = None if timed_out else os.waitstatus_to_exitcode(status)
    return (output, None if timed_out else wall, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss / 1024, code)


def run_diag(path: str, culprit: int, timeout_s: float) -> Run:
    output, wall, cpu, rss, code = measure(
        [sys.executable, "-m", "diagnose.cli", "analyze", path, "-p", PREFIX, "--json"], timeout_s)
    blamed = sorted({rank for verdict in json.loads(output)["verdicts"]
                     for rank in verdict["culprit_ranks"]}) if code in (0, 1) else []
    return Run(wall, cpu, rss, code, blamed, blamed == [culprit])


def run_torchfrtrace(path: str, culprit: int, timeout_s: float) -> Run:
    output, wall, cpu, rss, code = measure(
        [sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", path, "-p", PREFIX],
        timeout_s, keep_stderr=True)          # it reports through logging, on stderr
    blamed = set()
    for missing, named in BLAMED.findall(output):
        blamed |= {int(rank) for rank in missing.replace(",", " ").split()}
        if named:
            blamed.add(int(named))
    return Run(wall, cpu, rss, code, sorted(blamed), sorted(blamed) == [culprit])


def planted(ranks: int) -> int:
    """TP rank 5 of stage 3 in the middle replica: no edge of any group."""
    return ((ranks // (TP * PP) // 2) * PP + 3) * TP + 5


def one_case(workdir: str, ranks: int, fault: str, entries: int, timeout_s: float) -> Case:
    path = os.path.join(workdir, f"fr_{ranks}_{fault}")
    shutil.rmtree(path, ignore_errors=True)
    culprit = planted(ranks)
    start = time.perf_counter()
    write_serving_fr_dumps(path, Layout(TP, PP, ranks // (TP * PP)), culprit, fault, entries)
    write_s = time.perf_counter() - start
    size = sum(entry.stat().st_size for entry in os.scandir(path)) / 2 ** 20
    case = Case(ranks, fault, culprit, size, write_s, run_diag(path, culprit, timeout_s),
                run_torchfrtrace(path, culprit, timeout_s))
    shutil.rmtree(path)
    return case


def cell(run: Run) -> str:
    wall = f"{run.wall_s:.1f} s" if run.wall_s is not None else "timeout"
    named = "yes" if run.names_culprit else f"no {_ranks(run.blamed)}"
    return f"{wall}, {run.max_rss_mb:.0f} MB, culprit: {named}"


def _ranks(ranks: list[int]) -> str:
    shown = ", ".join(map(str, ranks[:4])) + (", ..." if len(ranks) > 4 else "")
    return f"(blames {len(ranks)}: {shown})" if ranks else "(blames none)"


def print_table(cases: list[Case]) -> None:
    print(f"{'ranks':>6} {'fault':<13} {'diag analyze':<44} {'torchfrtrace':<52} speed-up")
    for case in cases:
        speedup = f"{case.speedup:.1f}x" if case.speedup not in (None, float("inf")) else (
            "> timeout" if case.speedup else "-")
        print(f"{case.ranks:>6} {case.fault:<13} {cell(case.diag):<44} "
              f"{cell(case.torchfrtrace):<52} {speedup}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", default="1024,4096,16384")
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--entries", type=int, default=64, help="entries per dump")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per tool and case")
    parser.add_argument("--workdir", default=None, help="where the dumps go (default: a temp dir)")
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="fr_vs_torchfrtrace_")
    cases = []
    for ranks in map(int, args.ranks.split(",")):
        for fault in args.faults.split(","):
            cases.append(one_case(workdir, ranks, fault, args.entries, args.timeout_s))
            print_table(cases[-1:])
    print()
    print_table(cases)
    if args.json:
        with open(args.json, "w") as sink:
            json.dump({"machine": f"{platform.machine()}, {os.cpu_count()} cores",
                       "layout": f"tp={TP} pp={PP} dp=ranks/{TP * PP}",
                       "entries_per_dump": args.entries, "timeout_s": args.timeout_s,
                       "cases": [asdict(case) | {"speedup": case.speedup} for case in cases]},
                      sink, indent=1)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
