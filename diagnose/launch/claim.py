"""A run dir belongs to one `diag launch` at a time, and holds only what diag wrote.

diag writes a marker (MARKER_FILE, with diag's identity) into a run dir it
creates or takes while empty, and from then on deletes or overwrites files
there only where that marker is found. A non-empty directory without it is
refused before anything in it is touched, and so are `/`, $HOME and the
system's top-level directories, whatever they hold.

The launcher holds an flock on `launch.lock` in the run dir for its whole life
(and its guardian holds the same lock until the job it guards is gone), so a
second launch on a live run dir is refused before it touches a file of the
first. The lock goes away with the last process holding it, however it ends.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time

from diagnose.core.output import OUTPUT_LOG
from diagnose.core.schema import Document
from diagnose.launch import judged_file
from diagnose.launch.collector import EXIT_FILE
from diagnose.probe.marks import ALONE_CLAIM, ARMED_FILE
from diagnose.probe.notes import NOTES_FILE

LOCK_FILE = "launch.lock"
MARKER_FILE = ".diag-run"
MARKER_IDENTITY = "hangscope diag run dir"
MARKER_LIMIT = 4096
SYSTEM_PARENTS = ("/", "/usr", "/var", "/usr/local")   # their children are the system's
SYSTEM_TREES = ("/proc/", "/sys/", "/dev/", "/etc/", "/boot/")


class RunDirError(Exception):
    """The run dir cannot be used: one line says why."""


def claim(run_dir: str) -> int:
    """Creates run_dir if needed, marks it as diag's and locks it; the lock's
    file descriptor, which must stay open as long as the run dir is in use.
    Then clears what an earlier run left there."""
    refuse_system_dir(run_dir)
    try:
        os.makedirs(run_dir, exist_ok=True)
        mark(run_dir)
        fd = os.open(os.path.join(run_dir, LOCK_FILE), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as error:
        raise RunDirError(f"cannot use run dir {run_dir}: {error.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        if error.errno not in (errno.EWOULDBLOCK, errno.EACCES):
            raise RunDirError(f"cannot lock run dir {run_dir}: {error.strerror}") from None
        raise RunDirError(f"run dir {run_dir} is in use by another diag launch (pid "
                          f"{holder if holder.isdigit() else 'unknown'}); give another --run-dir") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        clear_run_files(run_dir)
    except (OSError, RunDirError) as error:
        os.close(fd)
        if isinstance(error, RunDirError):
            raise
        raise RunDirError(f"cannot use run dir {run_dir}: {error.strerror}") from None
    return fd


def refuse_system_dir(run_dir: str) -> None:
    """`/`, $HOME and the directories right under /, /usr and /var are never run dirs."""
    real = os.path.realpath(run_dir)
    home = os.path.realpath(os.path.expanduser("~"))
    if (real in ("/", home) or os.path.dirname(real) in SYSTEM_PARENTS
            or real.startswith(SYSTEM_TREES)):
        raise RunDirError(f"cannot use run dir {run_dir}: {real} is a system or home "
                          f"directory; give a new directory, e.g. --run-dir runs/mine")


def mark(run_dir: str) -> None:
    """Marks run_dir as diag's if it is empty; refuses it if it holds files and
    no marker of diag's. OSError for what the file system refuses."""
    if is_marked(run_dir):
        return
    if os.listdir(run_dir):
        raise RunDirError(f"cannot use run dir {run_dir}: it holds files that diag did not write "
                          f"(no {MARKER_FILE} marker); give a new or empty directory")
    body = json.dumps({"written_by": MARKER_IDENTITY, "pid": os.getpid(), "at": time.time()})
    try:
        fd = os.open(os.path.join(run_dir, MARKER_FILE),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except FileExistsError:     # another diag marked it first: the lock decides between us
        if not is_marked(run_dir):
            raise RunDirError(f"cannot use run dir {run_dir}: its {MARKER_FILE} is not diag's") \
                from None
        return
    with os.fdopen(fd, "w") as sink:
        sink.write(body + "\n")


def is_marked(run_dir: str) -> bool:
    """Whether run_dir holds diag's marker: a regular file naming diag."""
    try:
        fd = os.open(os.path.join(run_dir, MARKER_FILE), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    with os.fdopen(fd, "rb") as source:
        if not stat.S_ISREG(os.fstat(source.fileno()).st_mode):
            return False
        text = source.read(MARKER_LIMIT)
    try:
        return json.loads(text).get("written_by") == MARKER_IDENTITY
    except (ValueError, AttributeError):
        return False


def clear_run_files(run_dir: str) -> None:
    """Remove what an earlier run left in run_dir, a run dir of diag's: probe
    files, dumps, its output and outcome. Anything by those names that is not a plain file
    is not diag's: the run dir is refused, nothing removed."""
    names = [name for name in os.listdir(run_dir) if _is_run_file(name)]
    for name in names:
        if not stat.S_ISREG(os.lstat(os.path.join(run_dir, name)).st_mode):
            raise RunDirError(f"cannot use run dir {run_dir}: {name} is not a file diag wrote")
    for name in names:
        os.remove(os.path.join(run_dir, name))


def _is_run_file(name: str) -> bool:
    return (name.endswith(".probe")
            or name.startswith(("stacks-", "node-", "error-", "fatal-", "hook-", "state-"))
            or name in (EXIT_FILE, Document.REPORT, Document.LAUNCH, OUTPUT_LOG, ARMED_FILE,
                         ALONE_CLAIM, NOTES_FILE, judged_file.NAME, judged_file.PART))
