"""Python stacks of a rank taken from outside it: py-spy. The same shape as the
probe's own dumps ({thread name: frames}, outermost first)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from diagnose.core.frames import frame_label, is_native, native_label

_LOCKS_LOCK = threading.Lock()
_PID_LOCKS: dict[int, threading.Lock] = {}   # one py-spy at a time on a process
TRACED_WAIT_S = 2.0     # for another tracer to let the process go (its dump pauses it)


@dataclass
class ExternalStacks:
    threads: dict[str, list[str]] | None  # None when py-spy gave nothing
    note: str | None = None               # why not (or why not native), in one line
    denied: bool = False                  # py-spy was refused ptrace over the process
    main: str | None = None               # the name in `threads` of the process's main thread


def py_spy_dump(pid: int, native: bool = False, timeout: float = 10.0,
                nonblocking: bool = False) -> ExternalStacks:
    """`py-spy dump --json` of another process (needs ptrace rights over it). With
    native, C/C++ frames too, marked as such; where py-spy cannot give them, its
    Python frames, with a note that says why. nonblocking (Python frames only)
    reads without pausing the process, so it works while another dump pauses it,
    at the price of a stack that may be torn."""
    exe = shutil.which("py-spy") or _beside_python("py-spy")
    if exe is None:
        return ExternalStacks(None, "py-spy is not installed (pip install py-spy)")
    if nonblocking and not native:
        return _run(exe, pid, False, timeout, ["--nonblocking"])
    with _LOCKS_LOCK:
        lock = _PID_LOCKS.setdefault(pid, threading.Lock())
    with lock:                     # a second dump that pauses a paused process fails
        return _dump(exe, pid, native, timeout)


def _dump(exe: str, pid: int, native: bool, timeout: float) -> ExternalStacks:
    stacks = _run(exe, pid, native, timeout)
    if not native:
        return stacks
    if stacks.threads is None:
        python_only = _run(exe, pid, False, timeout)
        if python_only.threads is None:
            return python_only          # no stacks at all: --native is not the cause
        python_only.note = f"no native frames for pid {pid}: {stacks.note}; Python frames only"
        return python_only
    if not any(is_native(frame) for frames in stacks.threads.values() for frame in frames):
        stacks.note = (f"py-spy --native gave no native frame for pid {pid} (its build may "
                       f"not unwind native stacks on this platform); Python frames only")
    return stacks


def _run(exe: str, pid: int, native: bool, timeout: float,
         extra: list[str] | None = None) -> ExternalStacks:
    """One dump; one more where ptrace was refused: a process another tracer
    holds (a py-spy of another diag process: the launcher's sampler while diag
    dump runs) refuses a second one with EPERM, as a process ptrace may not read
    does. Each attaching dump first waits for the process to be free."""
    command = [exe, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    command += extra or []
    attaches = "--nonblocking" not in command
    for _ in range(2):
        if attaches:
            _wait_untraced(pid, min(timeout, TRACED_WAIT_S))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return ExternalStacks(None, f"py-spy dump of pid {pid} took over {timeout:g}s")
        if done.returncode == 0 or not _denied(done.stderr):
            break
    if done.returncode != 0:
        return ExternalStacks(None, _failure_note(pid, done.stderr), _denied(done.stderr))
    try:
        dump = json.loads(done.stdout)
        return ExternalStacks(threads_from_json(dump), main=_main_thread(dump, pid))
    except (ValueError, KeyError, TypeError) as error:
        return ExternalStacks(None, f"py-spy output for pid {pid} not understood: {error}")


def _wait_untraced(pid: int, wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    while _tracer(pid) and time.monotonic() < deadline:
        time.sleep(0.02)


def _tracer(pid: int) -> int:
    """The pid of the process tracing `pid` (0: none, or it cannot be told)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _beside_python(name: str) -> str | None:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _denied(stderr: str) -> bool:
    lowered = stderr.lower()
    return "permission" in lowered or "operation not permitted" in lowered


def _failure_note(pid: int, stderr: str) -> str:
    text = _telling_line(stderr)
    lowered = stderr.lower()
    if _denied(stderr):
        return (f"py-spy may not read pid {pid}: {text} (run as root, or allow ptrace: "
                f"sysctl kernel.yama.ptrace_scope=0, or docker --cap-add SYS_PTRACE)")
    if "no such" in lowered or "failed to find" in lowered:
        return f"py-spy: pid {pid} is gone ({text})"
    return f"py-spy dump of pid {pid} failed: {text}"


def _telling_line(stderr: str) -> str:
    """py-spy's error in one line: its first, with the innermost cause where it
    lists causes ("Caused by:", then numbered lines; a backtrace may follow)."""
    lines = [line.strip() for line in stderr.strip().splitlines()]
    if not lines:
        return "no message"
    causes = []
    if "Caused by:" in lines:
        for line in lines[lines.index("Caused by:") + 1:]:
            number, _, cause = line.partition(": ")
            if not number.isdigit():
                break
            causes.append(cause)
    return f"{lines[0]} ({causes[-1]})" if causes else lines[0]


def _thread_name(thread: dict, taken: dict) -> str:
    name = thread.get("thread_name") or f"thread {thread['thread_id']}"
    return f"{name} ({thread['thread_id']})" if name in taken else name


def _main_thread(dump: list[dict], pid: int) -> str | None:
    """The name threads_from_json gives the thread whose OS id is the pid."""
    taken: dict = {}
    for thread in dump:
        name = _thread_name(thread, taken)
        taken[name] = True
        if thread.get("os_thread_id") == pid:
            return name
    return None


def threads_from_json(dump: list[dict]) -> dict[str, list[str]]:
    """py-spy lists frames innermost first; ours are outermost first. A native
    frame is one py-spy names a library ("module") for."""
    threads = {}
    for thread in dump:
        threads[_thread_name(thread, threads)] = [native_label(frame["module"], frame["name"]) if frame.get("module")
                         else frame_label(frame["filename"], frame["line"], frame["name"])
                         for frame in reversed(thread["frames"])]
    return threads
