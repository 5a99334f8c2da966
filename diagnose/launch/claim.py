"""A run dir belongs to one `diag launch` at a time.

The launcher holds an flock on `launch.lock` in the run dir for its whole life
(and its guardian holds the same lock until the job it guards is gone), so a
second launch on a live run dir is refused before it touches a file of the
first. The lock goes away with the last process holding it, however it ends.
"""
from __future__ import annotations

import errno
import fcntl
import os

from diagnose.launch.collector import EXIT_FILE
from diagnose.probe.marks import ARMED_FILE

LOCK_FILE = "launch.lock"


class RunDirError(Exception):
    """The run dir cannot be used: one line says why."""


def claim(run_dir: str) -> int:
    """Creates run_dir if needed and locks it; the lock's file descriptor, which
    must stay open as long as the run dir is in use. Then clears what an earlier
    run left there."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RunDirError(f"cannot use run dir {run_dir}: {error.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
        os.close(fd)
        if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise RunDirError(f"cannot lock run dir {run_dir}: {error.strerror}") from None
        raise RunDirError(f"run dir {run_dir} is in use by another diag launch (pid {holder}); "
                          f"give another --run-dir") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        clear_run_files(run_dir)
    except OSError as error:
        os.close(fd)
        raise RunDirError(f"cannot use run dir {run_dir}: {error.strerror}") from None
    return fd


def clear_run_files(run_dir: str) -> None:
    """Remove what an earlier run left in run_dir: probe files, dumps, its outcome."""
    for name in os.listdir(run_dir):
        if (name.endswith(".probe") or name.startswith(("stacks-", "node-", "error-", "fatal-"))
                or name in (EXIT_FILE, "report.json", ARMED_FILE)):
            os.remove(os.path.join(run_dir, name))
