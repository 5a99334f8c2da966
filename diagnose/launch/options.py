"""What `diag launch` is asked to do (LaunchOptions, from the command line or
diag demo) and the environment the command then runs in: the run dir, the
probe's bootstrap on its path, the marks, faults and per-rank toggles."""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass, field

import psutil

from diagnose import probe
from diagnose.analysis.thresholds import Thresholds
from diagnose.launch import flight
from diagnose.probe import faults, marks, rank_env

PROBE_PATH_VAR = "DIAG_PROBE_PATH"   # the probe's own dependencies, for the job's Python
BOOTSTRAP_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "probe",
                             "bootstrap")


@dataclass
class LaunchOptions:
    command: list[str]
    run_dir: str
    thresholds: Thresholds = field(default_factory=Thresholds)
    on_hang: str = "report"             # escalate.OnHang's text: report, kill:5, wait, ...
    launch_blocking: str | None = None  # "all" or "0,3"
    nccl_debug: str | None = None
    faults: list[faults.FaultSpec] = field(default_factory=list)
    output: str | None = None           # -o: a copy of report.json
    marks: list[str] = field(default_factory=list)  # --mark module:Qualified.name[=phase]
    echo_output: bool = True            # copy the command's output to our stderr (at first:
                                        # the live view and the TUI change Launcher.output.echo)
    nnodes: int = 1                     # multi-node: the head listens, the others report to it
    node_rank: int = 0
    listen: str | None = None           # the head: HOST:PORT its agents report to
    head: str | None = None             # an agent: the head's HOST:PORT
    metrics: tuple[str, int] | None = None  # (address, port) of /metrics and /health


def command_env(opts: LaunchOptions) -> dict[str, str]:
    env = dict(os.environ)
    env[probe.RUN_DIR_VAR] = os.path.abspath(opts.run_dir)
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [BOOTSTRAP_DIR, env.get("PYTHONPATH")]))
    env[PROBE_PATH_VAR] = os.path.dirname(os.path.dirname(os.path.abspath(psutil.__file__)))
    if opts.marks:
        env[marks.MARKS_VAR] = ";".join(opts.marks)
    if opts.faults:
        env[faults.ENV_VAR] = ";".join(map(str, opts.faults))
    if opts.launch_blocking:
        env[rank_env.LAUNCH_BLOCKING_VAR] = opts.launch_blocking
    if opts.nccl_debug:
        env[rank_env.NCCL_DEBUG_VAR] = opts.nccl_debug
    env |= flight.fr_env(opts.run_dir, env)
    return env


def options_json(opts: LaunchOptions) -> dict:
    """The options as launch.json records them, beside the command."""
    return {k: v for k, v in asdict(opts).items() if k != "command"} | {
        "faults": [str(spec) for spec in opts.faults]}


def default_run_dir() -> str:
    return os.path.join("runs", time.strftime("%Y%m%d-%H%M%S"))
