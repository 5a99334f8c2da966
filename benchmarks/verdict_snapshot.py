"""The verdicts of the fault matrix and of the torchrun cases, written down so that
a refactoring can show it changed none of them.

    PYTHONPATH=. python benchmarks/verdict_snapshot.py run -o FILE [--only NAME...]
    PYTHONPATH=. python benchmarks/verdict_snapshot.py compare BEFORE AFTER

`run` starts each case under `diag launch --on-hang kill` (the engine at tp=2 pp=4
with one injected fault, as tests/test_fault_matrix.py does, and the torchrun
programs of tests/test_generic.py), then `diag analyze` on its run dir, and writes
per case the exit code and each verdict's kind, culprit, victims, phase, step,
group and seq, live and offline. `compare` prints a table of the cases and every
field that differs, and exits 1 if any does. (vLLM's verdicts are checked by
tests/test_vllm*.py, whose vLLM starts take minutes each.)
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "programs")
FIELDS = ("kind", "culprit_ranks", "victim_ranks", "phase", "step", "group", "seq")

ENGINE = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
          "-pp", "4", "--ignore-eos"]
PROMPTS = ["--prompt", "Where does the pipeline stop?", "--prompt", "Which rank is late?"]
TOKENS = ["--max-tokens", "32"]


@dataclass
class Case:
    name: str
    command: list[str]
    fault: str | None = None                  # diag launch --fault
    env: dict[str, str] = field(default_factory=dict)
    marks: list[str] = field(default_factory=list)


def _engine(name: str, fault: str | None, args: list[str]) -> Case:
    return Case(name, ENGINE + args, fault)


def _torchrun(name: str, program: str, nproc: int, toy_fault: str = "",
              marks: tuple[str, ...] = ()) -> Case:
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               "--monitor-interval", "0.5", "--master-port", "{port}",
               os.path.join(PROGRAMS, program)]
    return Case(name, command, env={"TOY_FAULT": toy_fault}, marks=list(marks))


CASES = [
    _engine("engine_never_reached", "rank=6,at=execute_model,step=0,kind=hang",
            PROMPTS + TOKENS),
    _engine("engine_stuck_in_forward", "rank=4,at=forward,step=5,kind=hang", PROMPTS + TOKENS),
    _engine("engine_skip_tp_collective", "rank=5,at=forward,step=4,kind=skip_collective",
            PROMPTS + TOKENS),
    _engine("engine_tp2_skip_collective", "rank=1,at=forward,step=4,kind=skip_collective",
            ["--prompt", "hello there", "--max-tokens", "32", "-pp", "1"]),
    _engine("engine_pp2_skip_send", "rank=0,at=forward,step=4,kind=skip_collective",
            ["--prompt", "hello there", "--max-tokens", "32", "-tp", "1", "-pp", "2"]),
    _engine("engine_crash", "rank=2,at=execute_model,step=3,kind=crash", PROMPTS + TOKENS),
    _engine("engine_straggler", "rank=7,at=execute_model,step=all,kind=sleep:1.5",
            PROMPTS + ["--max-tokens", "6"]),
    _engine("engine_skip_broadcast", "rank=3,at=dequeue,step=6,kind=skip_broadcast",
            PROMPTS + TOKENS),
    _engine("engine_healthy", None, PROMPTS + ["--max-tokens", "8"]),
    _torchrun("torchrun_healthy", "dp_train.py", 2),
    _torchrun("torchrun_skip_allreduce", "dp_train.py", 2, "skip_allreduce:1:5"),
    _torchrun("torchrun_skip_once", "dp_train.py", 4, "skip_once:2:10"),
    _torchrun("torchrun_pipeline_no_send", "pipeline.py", 4, "no_send:2:5"),
    _torchrun("torchrun_exit", "dp_train.py", 2, "exit:1:5"),
    _torchrun("torchrun_never_reached", "dp_train.py", 2, "late_start:1:0",
              marks=("toy_steps:train_step",)),
]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fields(body: dict) -> list[dict]:
    return [{name: verdict.get(name) for name in FIELDS} for verdict in body["verdicts"]]


def run_case(case: Case, workdir: str) -> dict:
    run_dir, report = os.path.join(workdir, "run"), os.path.join(workdir, "report.json")
    command = [sys.executable, "-m", "diagnose.cli", "launch", "--on-hang", "kill",
               "--run-dir", run_dir, "-o", report]
    command += ["--fault", case.fault] if case.fault else []
    command += [arg for mark in case.marks for arg in ("--mark", mark)]
    port = str(_free_port())
    command += ["--", *(port if arg == "{port}" else arg for arg in case.command)]
    env = dict(os.environ, PYTHONPATH=REPO, **case.env)
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=400)
    if not os.path.exists(report):
        return {"exit_code": done.returncode, "error": done.stderr[-2000:]}
    offline = subprocess.run([sys.executable, "-m", "diagnose.cli", "analyze", run_dir, "--json"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    with open(report) as f:
        live = json.load(f)
    return {"exit_code": done.returncode, "verdicts": _fields(live),
            "analyze": _fields(json.loads(offline.stdout))}


def run(out: str, only: list[str]) -> None:
    cases = [case for case in CASES if not only or case.name in only]
    results = {}
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="verdict-snapshot-") as workdir:
            results[case.name] = run_case(case, workdir)
        verdicts = results[case.name].get("verdicts", [])
        print(f"{case.name:32} exit {results[case.name]['exit_code']}  "
              + (", ".join(f"{v['kind']} {v['culprit_ranks']}" for v in verdicts) or "-"),
              flush=True)
    with open(out, "w") as f:
        json.dump({"fields": list(FIELDS), "cases": results}, f, indent=1, sort_keys=True)
        f.write("\n")


def _differences(before: dict, after: dict) -> list[str]:
    lines = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            lines.append(f"  {key}: {json.dumps(before.get(key))} -> {json.dumps(after.get(key))}")
    return lines


def compare(before_path: str, after_path: str) -> int:
    with open(before_path) as f:
        before = json.load(f)["cases"]
    with open(after_path) as f:
        after = json.load(f)["cases"]
    changed = 0
    for name in sorted(set(before) | set(after)):
        differences = _differences(before.get(name) or {}, after.get(name) or {})
        if name not in before or name not in after:
            differences = [f"  only in {'after' if name not in before else 'before'}"]
        print(f"{name:32} {'DIFFERS' if differences else 'same'}")
        for line in differences:
            print(line)
        changed += bool(differences)
    print(f"{len(set(before) | set(after)) - changed} same, {changed} differ")
    return 1 if changed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    verbs = parser.add_subparsers(dest="verb", required=True)
    run_parser = verbs.add_parser("run", help="run the cases, write their verdicts")
    run_parser.add_argument("-o", "--out", required=True)
    run_parser.add_argument("--only", nargs="*", default=[], choices=[c.name for c in CASES])
    compare_parser = verbs.add_parser("compare", help="diff two files of `run`")
    compare_parser.add_argument("before")
    compare_parser.add_argument("after")
    args = parser.parse_args()
    if args.verb == "run":
        run(args.out, args.only)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
