"""The names a process of the engine gives itself, so that `diag attach` can tell
which rank a process is from outside it (/proc/PID/comm), as vLLM's process
titles (`VLLM::Worker_PP1_TP0`) do for its workers."""
from __future__ import annotations

import ctypes
import ctypes.util
import re

ENGINE_RANK = re.compile(r"^engine-rank-(\d{1,4})$")
PR_SET_NAME = 15
COMM_BYTES = 15        # the kernel keeps 15 bytes of a name, and a NUL


def engine_rank_name(rank: int) -> str:
    return f"engine-rank-{rank}"


def name_this_process(name: str) -> bool:
    """Set the calling thread's name (the process's comm, from its main thread);
    False where the platform has no prctl: a name is a convenience, never a need."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_NAME, name.encode()[:COMM_BYTES], 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
