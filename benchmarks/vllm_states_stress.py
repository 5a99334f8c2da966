"""Issue #24's cases on real vLLM (its CPU build, .venv-vllm from ./setup.sh
--tests), repeated: a compile inside a step is progress, not a hang, and a caught
exception is named however vLLM's shutdown races diag's judgment.

    python benchmarks/vllm_states_stress.py [--case compile|raised] [--repeats N] \
        [--shared-cache] [--keep DIR] [-o RESULTS.json]

--case compile (the default; benchmarks/results/vllm_states_stress.json): each
run with a fresh compile cache (so vLLM's own start-up compile is cold too; with
--shared-cache the runs share one, which makes a run about 2 minutes, not 10) and
fresh requests. Two cases (done-when 4), under `diag launch --on-hang kill`, faults
from the tests' own vLLM plugin (tests/vllm_env/faultplugin) inside the wrapped
Worker.execute_model:
  - tp=2 pp=2 compiled: rank 1 runs real torch.compiles of new functions for
    30 s in its 3rd execute_model (Inductor's C++ builds in children, its cache
    lock);
  - tp=2 --enforce-eager: rank 0 does the same.
While the compile runs, diag's state samples (state-R.json) are read for a rank
found compiling; after it, requests must still be served; then vLLM is stopped with SIGINT.
Right: no verdict at any time (diag did not end the run, the report holds
none) and a rank was seen compiling.

--case raised (benchmarks/results/vllm_raised_stress.json; done-when 3): tp=2
compiled, rank 0 raises RuntimeError inside its 4th execute_model, while requests
run; the runs share one compile cache (--work keeps it between calls). Rank 0 is
vLLM's output rank: vLLM's engine ends a second or so later, while rank 1 waits
in the step's all-reduce. Right: the one verdict is `raised [0]`, the exception
named, rank 1 its victim, and diag's exit code fits who ended the run (1: diag,
after the stall limit; 4: vLLM, first). Each run keeps how its ranks stood at the
final judgment (the report's rank rows) and how long after the exception the job
was over (exit.json's ended_at: after diag ended what vLLM left running).

--case raised-engine (benchmarks/results/engine_raised_stress.json): the same on
our own engine (tests/test_states_e2e.py's case): tp=2, rank 1 raises inside its
execute_model at step 3 (--fault), the engine catches it. Right: `raised [1]`.

--keep DIR copies every run dir there.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from diagnose.cli.common import EXIT_CRASHED, EXIT_HEALTHY, EXIT_VERDICTS  # noqa: E402
from helpers.run import ENGINE, PROMPTS, launch as launch_diag  # noqa: E402
from helpers.vllm_faults import launch, plugin_installed  # noqa: E402
from helpers.vllm_serving import make_checkpoint  # noqa: E402

COMPILE_S = 600.0
RESULTS = {"compile": "benchmarks/results/vllm_states_stress.json",
           "raised": "benchmarks/results/vllm_raised_stress.json",
           "raised-engine": "benchmarks/results/engine_raised_stress.json"}


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
    """Whether diag's state sampler has a rank as compiling now (its state-R.json,
    what `diag analyze` and the TUI show): read directly, since a `diag analyze`
    call on this loaded 2-core machine can outlast a sample's 20 s of display."""
    for path in run_dir.glob("state-*.json"):
        try:
            if json.loads(path.read_text()).get("activity") == "compiling":
                return True
        except (OSError, ValueError):
            continue                     # written beside, then renamed: read the next time
    return False


def run_case(case: Case, repeat: int, checkpoint: Path, work: Path, cache: Path) -> Outcome:
    fault = f"rank={case.rank},call=3,kind=compile,seconds=30"
    run = launch(work, checkpoint, cache, fault, pp=case.pp, eager=case.eager)
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


@dataclass
class Raised:
    repeat: int
    seconds: float                   # vLLM: until it was ready; our engine: the whole run
    verdicts: list[str]
    detected_after_s: float | None   # the first verdict's
    ended_by: str                    # "diag" (a verdict ended the run) or "vllm"
    job_ended_after_s: float | None   # from rank 0's exception to exit.json's ended_at: the
                                      # job over, what vLLM left running ended by diag
    crashed_rank: int | None
    exit_code: int
    at_the_end: list[str]            # each rank's row as the final judgment saw it
    right: bool


def run_raised(repeat: int, checkpoint: Path, work: Path, cache: Path) -> Raised:
    run = launch(work, checkpoint, cache, "rank=0,call=4,kind=raise")
    try:
        ready_s = run.start_requests()
        exit_code = run.server.finish()
    finally:
        run.stop.set()
        if run.server.process.poll() is None:
            run.server.process.kill()
            run.server.finish()
    report = run.report()
    verdicts = report["verdicts"]
    first = verdicts[0] if verdicts else {}
    by_vllm = report["command_exit"] is not None
    crashed = (report.get("crashed") or {}).get("rank")
    right = ([v["culprit_ranks"] for v in verdicts] == [[0]] and first["kind"] == "raised"
             and first["victim_ranks"] == [1] and "hs_test_faults: rank 0 raised at call 4"
             in first["summary"] and exit_code == (EXIT_CRASHED if by_vllm else EXIT_VERDICTS)
             and (crashed == 0 or not by_vllm))
    rows = [f"rank {row['rank']}: {row['state']} {row['phase'] or '-'} step {row['step']}, "
            f"heartbeat {row['heartbeat_age_s']} s old" for row in report["ranks"]]
    return Raised(repeat, round(ready_s, 1),
                  [f"{v['kind']} {v['culprit_ranks']} victims {v['victim_ranks']}"
                   for v in verdicts], first.get("detected_after_s"),
                  "vllm" if by_vllm else "diag", _job_ended_after(run.run_dir), crashed,
                  exit_code, rows, right)


def run_raised_engine(repeat: int, work: Path) -> Raised:
    work.mkdir(parents=True)
    started = time.monotonic()
    done = launch_diag(work, ENGINE[:6] + ["-tp", "2", "-pp", "1", "--ignore-eos", *PROMPTS[:2]],
                       "--fault", "rank=1,at=execute_model,step=3,kind=raise", timeout=300,
                       env={"TORCHINDUCTOR_CACHE_DIR": str(work / "inductor")})
    report, code = done.report, done.body()["exit_code"]
    verdicts = report["verdicts"]
    first = verdicts[0] if verdicts else {}
    by_engine = report["command_exit"] is not None
    right = ([v["culprit_ranks"] for v in verdicts] == [[1]] and first["kind"] == "raised"
             and "FaultRaised" in first["summary"] and first["step"] == 3)
    rows = [f"rank {row['rank']}: {row['state']} {row['phase'] or '-'} step {row['step']}"
            for row in report["ranks"]]
    return Raised(repeat, round(time.monotonic() - started, 1),
                  [f"{v['kind']} {v['culprit_ranks']} victims {v['victim_ranks']}"
                   for v in verdicts], first.get("detected_after_s"),
                  "engine" if by_engine else "diag", None, (report.get("crashed") or {}).get(
                      "rank"), code, rows, right)


def _job_ended_after(run_dir: Path) -> float | None:
    try:
        raised_at = json.loads((run_dir / "error-0.json").read_text())["at"]
        ended_at = json.loads((run_dir / "exit.json").read_text())["ended_at"]
    except (OSError, ValueError, KeyError):
        return None
    return round(ended_at - raised_at, 2)


def show_raised(outcomes: list[Raised], engine: bool) -> None:
    table = Table(title="tp=2, rank 1 raises inside execute_model step 3 on our engine" if engine
                  else "tp=2, rank 0 raises inside its 4th execute_model on real vLLM")
    for column in ("run", "run s" if engine else "ready s", "verdicts", "detected s", "ended by",
                   "job ended s",
                   "exit", "right"):
        table.add_column(column)
    for o in outcomes:
        table.add_row(str(o.repeat), f"{o.seconds:.0f}", "; ".join(o.verdicts) or "-",
                      "-" if o.detected_after_s is None else f"{o.detected_after_s:.2f}",
                      o.ended_by, str(o.job_ended_after_s), str(o.exit_code), str(o.right))
    Console(width=160).print(table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=tuple(RESULTS), default="compile")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--keep", help="copy every run dir into this directory")
    parser.add_argument("--work", help="a directory kept between calls for the checkpoint "
                        "and the raised case's compile cache (default: a new one, removed)")
    parser.add_argument("--shared-cache", action="store_true",
                        help="--case compile: one compile cache for all runs")
    parser.add_argument("-o", "--output")
    args = parser.parse_args()
    output = args.output or RESULTS[args.case]
    if args.case != "raised-engine" and not plugin_installed():
        sys.exit("vllm_states_stress.py: real vLLM or the tests' fault plugin is not installed "
                 "here: run ./setup.sh --tests")
    work = Path(args.work or tempfile.mkdtemp(prefix="vllm-states-"))
    checkpoint = work / "tiny-llama"
    if args.case != "raised-engine" and not checkpoint.exists():
        make_checkpoint(checkpoint)
    outcomes = []
    for repeat in range(args.repeats):
        runs = [(f"run-{repeat}", None)] if args.case != "compile" else [
            (f"run-{repeat}-{index}", case) for index, case in enumerate(CASES)]
        for name, case in runs:
            if case is not None:
                cache = work / ("cache" if args.shared_cache else f"{name}/cache")
                outcomes.append(run_case(case, repeat, checkpoint, work / name, cache))
            elif args.case == "raised":
                outcomes.append(run_raised(repeat, checkpoint, work / name, work / "cache"))
            else:
                outcomes.append(run_raised_engine(repeat, work / name))
            print(f"{name}: {asdict(outcomes[-1])}", flush=True)
            if args.keep:
                shutil.copytree(work / name / "run", Path(args.keep) / name, dirs_exist_ok=True)
            shutil.rmtree(work / name, ignore_errors=True)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    if args.case == "compile":
        show(outcomes)
    else:
        show_raised(outcomes, engine=args.case == "raised-engine")
    Path(output).write_text(json.dumps(
        {"schema_version": 1, "case": args.case, "shared_cache": args.shared_cache,
         "machine": platform.platform(),
         "cpus": os.cpu_count(), "load_average": os.getloadavg(),
         "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n")
    print(f"wrote {output}")


if __name__ == "__main__":
    main()
