"""Flight Recorder dumps on diag's request, from inside a rank.

`diag launch` points torch's dump files into the run dir (DUMP_VARS) and, for
NCCL, gives every rank a pipe (PIPE_VAR): ProcessGroupNCCL's own monitor thread
watches it and writes the dump, without the GIL. gloo has no such thread, yet
records to the same Flight Recorder (torch 2.7 and later), so for a job without
NCCL the probe's heartbeat thread writes the dump itself when diag asks for
stacks, without each entry's stack: symbolizing them takes some 10 s at the
first dump of a process (torch 2.13, CPU), and the probe's dump holds every
thread's stack already. A failure here is silent: the launcher notes the ranks whose dump it
did not find.
"""
from __future__ import annotations

import os
import sys

PIPE_VAR = "TORCH_NCCL_DEBUG_INFO_PIPE_FILE"          # torch opens PREFIX<rank>.pipe
DUMP_VARS = ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE")  # PREFIX<rank>
BUFFER_VARS = ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE")
RENAMED_IN = (2, 9)     # the torch that reads BUFFER_VARS[1] and keeps [0] as an alias
DUMP_PREFIX = "fr_trace_rank_"
PIPE_PREFIX = "fr_pipe_rank_"


def write_gloo_dump() -> None:
    """This rank's Flight Recorder, where torch.distributed runs without NCCL."""
    prefix = os.environ.get(DUMP_VARS[1])
    dist = sys.modules.get("torch.distributed")
    if not prefix or dist is None:
        return
    try:
        if not dist.is_initialized() or "nccl" in str(dist.get_backend()):
            return
        dump = sys.modules["torch"]._C._distributed_c10d._dump_fr_trace(includeStackTraces=False)
        path = f"{prefix}{dist.get_rank()}"
        with open(path + ".part", "wb") as sink:
            sink.write(dump)
        os.replace(path + ".part", path)
    except Exception:   # noqa: BLE001 - a dump must never raise in the host program
        pass


def drop_deprecated_alias(dist) -> None:
    """`diag launch` sets both names of the ring's size for any torch; from
    torch 2.9 the new one is read and the old one only warns, once per rank."""
    old, new = BUFFER_VARS
    if sys.modules["torch"].__version__ >= RENAMED_IN and os.environ.get(old) == os.environ.get(new):
        os.environ.pop(old, None)
