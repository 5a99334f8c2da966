"""Flight Recorder dumps on demand, the launcher's side: the environment that
points every rank's dump into RUN_DIR/fr, and the request for a dump of every
rank at once (diagnose/probe/fr_dump.py is the ranks' side).

torch writes a Flight Recorder dump by itself only at a process group's timeout
(often 10 min). With TORCH_NCCL_DEBUG_INFO_PIPE_FILE=PREFIX, each NCCL rank's
monitor thread makes a FIFO PREFIX<rank>.pipe and, about once a second, reads
it: anything written there makes it dump to TORCH_NCCL_DEBUG_INFO_TEMP_FILE +
<rank>. It needs TORCH_NCCL_TRACE_BUFFER_SIZE > 0. `diag analyze RUN_DIR/fr`
reads the dumps; `diag analyze RUN_DIR` names them.
"""
from __future__ import annotations

import errno
import glob
import os
import stat
import time

from diagnose.probe.fr_dump import BUFFER_VARS, DUMP_PREFIX, DUMP_VARS, PIPE_PREFIX, PIPE_VAR

FR_DIR = "fr"
BUFFER_ENTRIES = "2000"    # torch's own default ring
WAIT_S = 5.0               # a monitor thread looks at its pipe about once a second


def fr_env(run_dir: str, env: dict[str, str]) -> dict[str, str]:
    """The variables that send every rank's Flight Recorder dump into RUN_DIR/fr. A
    ring size the user chose (by either name, the new one first) is kept, under both
    names (the probe drops the old one where torch reads the new); where the dumps
    and pipes go is diag's."""
    directory = os.path.join(os.path.abspath(run_dir), FR_DIR)
    os.makedirs(directory, exist_ok=True)
    _clear(directory)
    size = next((env[var] for var in reversed(BUFFER_VARS) if env.get(var)), BUFFER_ENTRIES)
    added = dict.fromkeys(BUFFER_VARS, size)
    added |= {var: os.path.join(directory, DUMP_PREFIX) for var in DUMP_VARS}
    added[PIPE_VAR] = os.path.join(directory, PIPE_PREFIX)
    return added


def _clear(directory: str) -> None:
    """An earlier run's dumps and pipes (this run dir is diag's: claim.py)."""
    for name in os.listdir(directory):
        if name.startswith((DUMP_PREFIX, PIPE_PREFIX)):
            path = os.path.join(directory, name)
            if stat.S_ISREG(os.lstat(path).st_mode) or stat.S_ISFIFO(os.lstat(path).st_mode):
                os.remove(path)


def ask_nccl_ranks(run_dir: str) -> tuple[dict[int, float], list[str]]:
    """Writes to every rank's pipe: {rank: when it was asked}, and one note per
    pipe nobody reads (its rank is gone)."""
    asked, notes = {}, []
    for path in sorted(glob.glob(os.path.join(run_dir, FR_DIR, f"{PIPE_PREFIX}*.pipe"))):
        rank_text = os.path.basename(path)[len(PIPE_PREFIX):-len(".pipe")]
        if not rank_text.isdigit():
            continue
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as error:
            reason = "no process reads it" if error.errno == errno.ENXIO else error.strerror
            notes.append(f"Flight Recorder pipe of rank {rank_text}: {reason}")
            continue
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                asked[int(rank_text)] = time.time()
                os.write(fd, b"1")
        except OSError as error:
            notes.append(f"Flight Recorder pipe of rank {rank_text}: {error.strerror}")
        finally:
            os.close(fd)
    return asked, notes


def wait_for_dumps(run_dir: str, asked: dict[int, float],
                   wait_s: float = WAIT_S) -> tuple[dict[int, str], list[str]]:
    """The dumps the asked ranks wrote since they were asked, waited for up to
    wait_s; one note per rank that wrote none."""
    deadline = time.monotonic() + wait_s
    found: dict[int, str] = {}
    while True:
        for rank, since in asked.items():
            path = dump_path(run_dir, rank)
            if rank not in found and _written_since(path, since):
                found[rank] = path
        if len(found) == len(asked) or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    notes = [f"rank {rank}: no Flight Recorder dump within {wait_s:g} s of asking"
             for rank in sorted(set(asked) - set(found))]
    return found, notes


def dumps_in(run_dir: str) -> dict[int, str]:
    """Every rank's dump in RUN_DIR/fr, by rank."""
    dumps = {}
    for path in glob.glob(os.path.join(run_dir, FR_DIR, f"{DUMP_PREFIX}*")):
        rank_text = os.path.basename(path)[len(DUMP_PREFIX):]
        if rank_text.isdigit():
            dumps[int(rank_text)] = path
    return dict(sorted(dumps.items()))


def dump_path(run_dir: str, rank: int) -> str:
    return os.path.join(run_dir, FR_DIR, f"{DUMP_PREFIX}{rank}")


def _written_since(path: str, since: float) -> bool:
    """Written after `since` and done: torch writes the file in place, so a size
    that holds still over a short look is taken as the end of its write."""
    try:
        before = os.stat(path)
        if before.st_mtime < since - 1.0 or before.st_size == 0:
            return False
        time.sleep(0.02)
        return os.stat(path).st_size == before.st_size
    except OSError:
        return False
