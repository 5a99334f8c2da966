"""The run dir's logs the TUI shows: the selected rank's own log and the
command's output, their last lines only."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from diagnose.core.output import OUTPUT_LOG

TAIL_BYTES = 16 * 1024
RANK_TAIL_LINES = 20
OUTPUT_TAIL_LINES = 50
# A rank's own output, when whoever started the ranks split it by rank; else the
# NCCL debug file `diag launch --nccl-debug` has each rank write.
RANK_LOGS = ("rank-{rank}.log", "nccl-rank-{rank}.log")


@dataclass
class LogTail:
    name: str | None     # the file's name in the run dir; None: there is no such log
    lines: list[str]
    rank: int | None = None  # whose log; None: the command's output


def tail_lines(path: Path, count: int) -> list[str] | None:
    """The file's last `count` lines; None when it does not exist."""
    try:
        with open(path, "rb") as log:
            start = log.seek(max(0, log.seek(0, os.SEEK_END) - TAIL_BYTES))
            data = log.read()
    except FileNotFoundError:
        return None
    lines = data.decode(errors="replace").splitlines()
    return lines[1 if start else 0:][-count:]   # from mid-file, the first line is a part


def read_log_tail(run_dir: str, rank: int) -> LogTail:
    """The last lines of the rank's own log, the first of RANK_LOGS that exists."""
    for pattern in RANK_LOGS:
        name = pattern.format(rank=rank)
        lines = tail_lines(Path(run_dir) / name, RANK_TAIL_LINES)
        if lines is not None:
            return LogTail(name, lines, rank)
    return LogTail(None, [], rank)


def read_output_tail(run_dir: str) -> LogTail:
    """The last lines of the command's output, as `diag launch` copied it."""
    lines = tail_lines(Path(run_dir) / OUTPUT_LOG, OUTPUT_TAIL_LINES)
    return LogTail(OUTPUT_LOG if lines is not None else None, lines or [])
