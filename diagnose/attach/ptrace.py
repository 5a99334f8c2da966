"""Whether this diag may read another process's stacks, and what would let it.

py-spy reads a process's memory, which the kernel allows only to a tracer: the
same user without the target holding capabilities the caller lacks, or a
caller with CAP_SYS_PTRACE; Yama (kernel.yama.ptrace_scope) can narrow that
further. Reading /proc/PID/exe takes the same permission, so it is asked first.
"""
from __future__ import annotations

import os
import pwd

YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"


def may_trace(pid: int) -> bool:
    """False only where the kernel refused: a process that just ended is not
    a refusal."""
    try:
        os.readlink(f"/proc/{pid}/exe")
    except PermissionError:
        return False
    except OSError:
        pass
    return True


def refusal(pid: int, uid: int, who: str | None = None) -> str:
    """One line: what was refused, and what would allow it."""
    ways = ["run diag as root" if uid == 0
            else f"run diag as the job's user ({_user(uid)}) or as root" if uid > 0
            else "run diag as the job's user or as root",
            "give its container --cap-add SYS_PTRACE"]
    scope = _yama_scope()
    if scope not in (None, "0"):
        ways.append(f"set kernel.yama.ptrace_scope to 0 (it is {scope})")
    else:
        ways.append("allow ptrace in kernel.yama.ptrace_scope")
    return (f"may not read the stacks of pid {pid}{f' ({who})' if who else ''}: ptrace is "
            f"not permitted; "
            f"{', '.join(ways[:-1])}, or {ways[-1]}")


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name}, uid {uid}"
    except KeyError:
        return f"uid {uid}"


def _yama_scope() -> str | None:
    try:
        with open(YAMA_SCOPE) as source:
            return source.read(8).strip()
    except OSError:
        return None
