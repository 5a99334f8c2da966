"""diag as a subprocess, `diag launch` around a command, free ports, and waiting
for a condition instead of sleeping."""
from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

REPO = str(Path(__file__).resolve().parents[2])
PROGRAMS = os.path.join(REPO, "tests", "programs")
DIAG = (sys.executable, "-m", "diagnose.cli")


def free_port(consecutive: int = 1) -> int:
    """A TCP port P on 127.0.0.1 that nothing listens on now, with P + 1 ...
    P + consecutive - 1 free too (torchrun's rendezvous and diag's node link)."""
    while True:
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(socket.socket())
            first.bind(("127.0.0.1", 0))
            port = first.getsockname()[1]
            try:
                for offset in range(1, consecutive):
                    stack.enter_context(socket.socket()).bind(("127.0.0.1", port + offset))
            except OSError:
                continue
            return port


def wait_for(condition, timeout: float = 30.0, what: str = "the condition",
             every: float = 0.05):
    """condition()'s first truthy value, polled every `every` s; AssertionError
    after `timeout` s. A deadline, not a wait: it returns as soon as it holds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(every)


def diag_process(*args, env: dict | None = None, cwd=REPO, prefix=(), program=DIAG,
                 **popen) -> subprocess.Popen:
    """`diag ARGS` started with its output piped; the caller waits for it. This
    checkout's diag runs with os.environ and `env` over it; an installed one
    (program: its path) with `env` as its whole environment."""
    base = {**os.environ, "PYTHONPATH": REPO} if program == DIAG else {}
    return subprocess.Popen([*prefix, *program, *map(str, args)], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**base, **(env or {})}, **popen)


def diag(*args, timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    """`diag ARGS` run to its end (killed after `timeout` s); kwargs as diag_process."""
    proc = diag_process(*args, **kwargs)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def timed_diag(*args, **kwargs) -> tuple[subprocess.CompletedProcess, float]:
    """diag's result, and the seconds it took."""
    start = time.monotonic()
    done = diag(*args, **kwargs)
    return done, time.monotonic() - start


def attach_until_verdict(pid: int, tmp_path: Path, tries: int = 3):
    """(the last diag attach --json, its seconds, how many attaches it took). A peer
    still on its way into the step's wait (on a loaded machine, seconds after the
    fault) is seen moving, and attach then rightly says the job progresses (exit
    0): as a user would, attach again 2 s later, up to `tries` times. A verdict,
    right or wrong, or a failure ends the tries."""
    for attempt in range(1, tries + 1):
        done, took = timed_diag("attach", pid, "--run-dir", tmp_path / f"attach-{attempt}",
                                "--json")
        if done.returncode != 0 or not json.loads(done.stdout)["attach"]["moving"]:
            break
        time.sleep(2.0)
    return done, took, attempt


def launch_process(run_dir, command, *flags, **kwargs) -> subprocess.Popen:
    """`diag launch --run-dir RUN_DIR FLAGS -- COMMAND`, started; the caller waits."""
    return diag_process("launch", "--run-dir", run_dir, *flags, "--", *command, **kwargs)


@dataclass
class Launched:
    done: subprocess.CompletedProcess
    report: dict
    run_dir: Path

    def __iter__(self):
        return iter((self.done, self.report, self.run_dir))

    def body(self) -> dict:
        """The report, with diag's exit code, its stderr and the run dir added."""
        return {**self.report, "exit_code": self.done.returncode, "stderr": self.done.stderr,
                "run_dir": str(self.run_dir)}


def launch(tmp_path: Path, command, *flags, on_hang: str | None = "kill",
           timeout: float = 120, **kwargs) -> Launched:
    """`diag launch` around `command` run to its end, with its run dir in tmp_path;
    asserts that no process of the run is left, and reads the run's report.json."""
    run_dir = Path(tmp_path) / "run"
    hang = ("--on-hang", on_hang) if on_hang else ()
    done = diag("launch", "--run-dir", run_dir, *hang, *flags, "--", *command,
                timeout=timeout, **kwargs)
    assert not left_behind(run_dir), f"processes of {run_dir} are still alive"
    return Launched(done, json.loads((run_dir / "report.json").read_text()), run_dir)


# the real engine at tp=2 pp=4: 8 worker processes over gloo
ENGINE = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
          "-pp", "4", "--ignore-eos"]
PROMPTS = ["--prompt", "Where does the pipeline stop?", "--prompt", "Which rank is late?"]


# The Python (and so the torch release) of the torchrun jobs: another venv's, to run
# the torchrun tests on another torch (README, "Tests"); diag itself runs from this one.
TORCH_PYTHON = os.environ.get("HANGSCOPE_TORCH_PYTHON") or sys.executable


def torchrun(program: str, nproc: int, *args: str) -> list[str]:
    """torchrun of tests/programs/PROGRAM on NPROC local ranks, on a free port."""
    return [TORCH_PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--monitor-interval", "0.5", "--master-port", str(free_port()),
            os.path.join(PROGRAMS, program), *args]


def left_behind(run_dir) -> list[psutil.Process]:
    """Processes still running with this run's DIAG_RUN_DIR (torchrun's children included)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("DIAG_RUN_DIR") == str(run_dir):
                found.append(proc)
        except (psutil.AccessDenied, psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
    return found


def detect_bound(verdict: dict, base: float) -> float:
    """A test's bound on a verdict's detection time, `base`, plus the time the host
    kept the job off its CPUs, by which diag stretched its stall limit (the
    verdict's cpu_wait evidence): a loaded machine makes a rank slower, not hung."""
    stretch = [entry["stretched_limit_s"] - entry["limit_s"]
               for entry in verdict["evidence"].get("cpu_wait", {}).values()]
    return base + max(stretch, default=0.0)
