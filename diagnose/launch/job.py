"""The processes of the job `diag launch` runs, and how they are ended.

The command runs in a session of its own, and every process it spawns carries
the run dir in its environment (DIAG_RUN_DIR, which the probe needs): the job
is every process in that session or with that run dir, which finds also the
processes that start sessions of their own (torchrun's workers do).
"""
from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

import psutil

from diagnose import probe

POLL_S = 0.1           # a look at every process on the host costs some 20 ms
KILLED_WAIT_S = 5.0     # after SIGKILL, for the kernel to take them away
PR_SET_PDEATHSIG = 1


def job_processes(session: int, run_dir: str) -> list[psutil.Process]:
    """The live processes of the job whose command leads `session`; run_dir absolute."""
    found = []
    for process in psutil.process_iter():
        if process.pid == os.getpid():
            continue
        try:
            if ((os.getsid(process.pid) == session
                 or process.environ().get(probe.RUN_DIR_VAR) == run_dir)
                    and process.status() != psutil.STATUS_ZOMBIE):
                found.append(process)
        except (psutil.Error, OSError):
            pass
    return found


def end_job(session: int, run_dir: str, grace_s: float,
            command: subprocess.Popen | None = None, first: list[int] = ()) -> None:
    """SIGTERM every process of the job, SIGKILL those left after grace_s. The
    command, when it is our child, is reaped through its Popen: its exit code is
    the launcher's to read. The pids in `first` (the ranks) are ended before the
    rest, so that no rank still holds its device when its parent goes."""
    if first:
        _end_first(session, run_dir, grace_s, set(first))
    _signal_all(job_processes(session, run_dir), signal.SIGTERM)
    _wait_for_end(session, run_dir, grace_s, command)
    _signal_all(job_processes(session, run_dir), signal.SIGKILL)
    _wait_for_end(session, run_dir, KILLED_WAIT_S, command)


def _end_first(session: int, run_dir: str, grace_s: float, pids: set[int]) -> None:
    def left() -> list[psutil.Process]:
        return [process for process in job_processes(session, run_dir) if process.pid in pids]
    _signal_all(left(), signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left() and time.monotonic() < deadline:
        time.sleep(POLL_S)
    _signal_all(left(), signal.SIGKILL)
    deadline = time.monotonic() + KILLED_WAIT_S
    while left() and time.monotonic() < deadline:
        time.sleep(POLL_S)


def rank_pids(snapshot, parent: int) -> list[int]:
    """The pids of the snapshot's live ranks on this host, but the command's own."""
    here = socket.gethostname()
    ranks = snapshot.ranks.values() if snapshot is not None else []
    return [state.identity.pid for state in ranks if state.alive
            and state.identity.host == here and state.identity.pid != parent]


def shell_code(returncode: int) -> int:
    """A Popen returncode as a shell reports it: 128 + N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode


def _signal_all(processes: list[psutil.Process], sig: int) -> None:
    for process in processes:
        try:
            process.send_signal(sig)
        except psutil.Error:
            pass


def _wait_for_end(session: int, run_dir: str, timeout_s: float,
                  command: subprocess.Popen | None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if command is not None:
            command.poll()      # reaps it: a zombie child would count as alive
        if not job_processes(session, run_dir):
            return
        time.sleep(POLL_S)


def die_with_parent(signum: int) -> None:
    """This process gets `signum` when the process that started it dies, however
    it dies (Linux; elsewhere nothing)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signum)
