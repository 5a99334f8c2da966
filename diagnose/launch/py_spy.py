"""Python stacks of a rank taken from outside it: py-spy. The same shape as the
probe's own dumps ({thread name: frames}, outermost first)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass

from diagnose.core.frames import frame_label


@dataclass
class ExternalStacks:
    threads: dict[str, list[str]] | None  # None when py-spy gave nothing
    note: str | None = None               # why not, in one line


def py_spy_dump(pid: int, native: bool = False, timeout: float = 10.0) -> ExternalStacks:
    """`py-spy dump --json` of another process (needs ptrace rights over it)."""
    exe = shutil.which("py-spy") or _beside_python("py-spy")
    if exe is None:
        return ExternalStacks(None, "py-spy is not installed (pip install py-spy)")
    command = [exe, "dump", "--pid", str(pid), "--json"] + (["--native"] if native else [])
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return ExternalStacks(None, f"py-spy dump of pid {pid} took over {timeout:g}s")
    if done.returncode != 0:
        return ExternalStacks(None, _failure_note(pid, done.stderr))
    try:
        return ExternalStacks(_threads_from_json(json.loads(done.stdout)))
    except (ValueError, KeyError, TypeError) as error:
        return ExternalStacks(None, f"py-spy output for pid {pid} not understood: {error}")


def _beside_python(name: str) -> str | None:
    path = os.path.join(os.path.dirname(sys.executable), name)
    return path if os.access(path, os.X_OK) else None


def _failure_note(pid: int, stderr: str) -> str:
    text = stderr.strip().splitlines()[-1] if stderr.strip() else "no message"
    lowered = stderr.lower()
    if "permission" in lowered or "operation not permitted" in lowered:
        return (f"py-spy may not read pid {pid}: {text} (run as root, or allow ptrace: "
                f"sysctl kernel.yama.ptrace_scope=0, or docker --cap-add SYS_PTRACE)")
    if "no such" in lowered or "failed to find" in lowered:
        return f"py-spy: pid {pid} is gone ({text})"
    return f"py-spy dump of pid {pid} failed: {text}"


def _threads_from_json(dump: list[dict]) -> dict[str, list[str]]:
    """py-spy lists frames innermost first; ours are outermost first."""
    threads = {}
    for thread in dump:
        name = thread.get("thread_name") or f"thread {thread['thread_id']}"
        if name in threads:
            name = f"{name} ({thread['thread_id']})"
        threads[name] = [frame_label(frame["filename"], frame["line"], frame["name"])
                         for frame in reversed(thread["frames"])]
    return threads
