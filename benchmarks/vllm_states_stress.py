"""A compile inside a step is progress, not a hang: repeated on real vLLM (its
CPU build, .venv-vllm from ./setup.sh --tests), each run with a fresh compile
cache (so vLLM's own start-up compile is cold too) and fresh requests.

    python benchmarks/vllm_states_stress.py [--repeats 3] \
        [-o benchmarks/results/vllm_states_stress.json]

Two cases (issue #24, done-when 4), under `diag launch --on-hang kill`, faults
from the tests' own vLLM plugin (tests/vllm_env/faultplugin) inside the wrapped
Worker.execute_model:
  - tp=2 pp=2 compiled: rank 1 runs real torch.compiles of new functions for
    30 s in its 3rd execute_model (Inductor's C++ builds in children, its cache
    lock);
  - tp=2 --enforce-eager: rank 0 does the same.
While the compile runs, `diag analyze RUN_DIR --json` is asked what each rank
does; after it, requests must still be served; then vLLM is stopped with SIGINT.
Right: no verdict at any time (diag did not end the run, the report holds
none) and a rank was seen compiling.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from diagnose.cli.common import EXIT_HEALTHY  # noqa: E402
from helpers.vllm_faults import launch, plugin_installed  # noqa: E402
from helpers.vllm_serving import make_checkpoint  # noqa: E402

COMPILE_S = 600.0


@dataclass
class Case:
    name: str
    pp: int
    eager: bool
    rank: int


CASES = [Case("tp2 pp2 compiled, rank 1 compiles in step 3", 2, False, 1),
         Case("tp2 --enforce-eager, rank 0 compiles in step 3", 1, True, 0)]


@dataclass
class Outcome:
    case: str
    repeat: int
    ready_s: float
    compile_s: float             # the plugin's compile, begun to done
    seen_compiling: bool         # diag analyze said a rank compiles, during it
    served_after: int            # requests completed after the compile
    verdicts: list[str]
    exit_code: int
    right: bool


def compiling_seen(run_dir: Path) -> bool:
    done = subprocess.run([sys.executable, "-m", "diagnose.cli", "analyze", "--json",
                           str(run_dir)], capture_output=True, text=True, timeout=120)
    try:
        ranks = json.loads(done.stdout).get("ranks", [])
    except ValueError:
        return False
    return any(row.get("doing", "").startswith("compiling") for row in ranks)


def run_case(case: Case, repeat: int, checkpoint: Path, work: Path) -> Outcome:
    fault = f"rank={case.rank},call=3,kind=compile,seconds=30"
    run = launch(work, checkpoint, work / "cache", fault, pp=case.pp, eager=case.eager)
    seen = False
    try:
        ready_s = run.start_requests()
        began = run.fired(f"rank {case.rank} call 3: compile", COMPILE_S)
        while "compile done" not in run.server.log.read_text(errors="replace"):
            seen = seen or compiling_seen(run.run_dir)
            assert run.server.process.poll() is None, run.server.tail()
            time.sleep(0.5)
        compile_s = run.fired(f"rank {case.rank} call 3: compile done", COMPILE_S) - began
        after, exit_code = run.serve_more_then_stop()
    finally:
        run.stop.set()
        if run.server.process.poll() is None:
            run.server.process.kill()
            run.server.finish()
    verdicts = [f"{v['kind']} {v['culprit_ranks']}" for v in run.report()["verdicts"]]
    right = not verdicts and exit_code == EXIT_HEALTHY and seen and after >= 2
    return Outcome(case.name, repeat, round(ready_s, 1), round(compile_s, 1), seen, after,
                   verdicts, exit_code, right)


def show(outcomes: list[Outcome]) -> None:
    table = Table(title="a compile inside a step on real vLLM: progress, not a hang")
    for column in ("case", "run", "ready s", "compile s", "seen compiling", "served after",
                   "verdicts", "exit", "right"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(o.case, str(o.repeat), f"{o.ready_s:.0f}", f"{o.compile_s:.1f}",
                      str(o.seen_compiling), str(o.served_after), ", ".join(o.verdicts) or "-",
                      str(o.exit_code), str(o.right))
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("-o", "--output", default="benchmarks/results/vllm_states_stress.json")
    args = parser.parse_args()
    if not plugin_installed():
        sys.exit("vllm_states_stress.py: real vLLM or the tests' fault plugin is not installed "
                 "here: run ./setup.sh --tests")
    work = Path(tempfile.mkdtemp(prefix="vllm-states-"))
    checkpoint = make_checkpoint(work / "tiny-llama")
    outcomes = []
    for repeat in range(args.repeats):
        for index, case in enumerate(CASES):
            outcomes.append(run_case(case, repeat, checkpoint, work / f"run-{repeat}-{index}"))
            print(f"{case.name} (run {repeat}): {asdict(outcomes[-1])}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    show(outcomes)
    Path(args.output).write_text(json.dumps(
        {"schema_version": 1, "machine": platform.platform(), "cpus": os.cpu_count(),
         "load_average": os.getloadavg(), "outcomes": [asdict(o) for o in outcomes]},
        indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
