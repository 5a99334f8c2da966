"""diag logs: explain the known failure lines of serving and training logs.

Each file is read line by line (a huge log costs memory for one line), every
line is checked against PATTERNS, and each hit becomes a Finding that says in
one line what it means and what to do. Lines no pattern knows are ignored.
"""
from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

SNIFF_BYTES = 8192       # how much of a file decides whether it is text
MAX_TEXT = 200           # characters of the matched line kept in a finding


class LogReadError(Exception):
    """A file that cannot be scanned: missing, a directory, unreadable or binary."""


@dataclass
class Finding:
    path: str
    line: int
    kind: str
    explanation: str
    text: str            # the line that matched, trimmed


@dataclass
class Pattern:
    kind: str
    needles: tuple[str, ...]             # cheap substring tests before the regex
    regex: re.Pattern
    explain: Callable[[re.Match, str], str]


def _rank_of(line: str) -> str | None:
    """The rank a line names: PyTorch's '[rank3]:' or '[PG 0 Rank 3]', vLLM's 'rank=3'."""
    found = re.search(r"\[rank(\d+)\]|Rank (\d+)\]|\brank=(\d+)", line)
    return next(group for group in found.groups() if group) if found else None


def _rank_prefix(line: str) -> str:
    rank = _rank_of(line)
    return f"rank {rank}: " if rank is not None else ""


def _watchdog(match: re.Match, line: str) -> str:
    ran = re.search(r"ran for (\d+) milliseconds", line)
    after = f" after {int(ran.group(1)) / 1000:.0f} s" if ran else ""
    return (f"{_rank_prefix(line)}collective watchdog timeout in {match.group('op')} "
            f"SeqNum={match.group('seq')}{after}: this rank waited; the culprit is the rank "
            f"whose last SeqNum is lower or that is stuck elsewhere (compare every rank's SeqNum, "
            f"or rerun under diag launch)")


def _shm_broadcast(match: re.Match, line: str) -> str:
    return (f"vLLM's shared-memory broadcast found no free block in {match.group(1)} s: a worker "
            f"stopped taking the driver's broadcast (hung or busy in a collective); dump its "
            f"stacks (py-spy dump, or diag launch) to see where it is")


def _cuda_error(match: re.Match, line: str) -> str:
    rank = _rank_of(line)
    return (f"{_rank_prefix(line)}CUDA error '{match.group(1).strip()}': kernels run "
            f"asynchronously, so the reported line may be wrong; rerun with "
            f"CUDA_LAUNCH_BLOCKING=1 on that rank (diag launch --launch-blocking {rank or 'RANK'})")


def _oom(match: re.Match, line: str) -> str:
    return (f"{_rank_prefix(line)}out of GPU memory: lower gpu_memory_utilization, "
            f"max_num_seqs/max_num_batched_tokens or the context length, or add TP ranks")


def _lmcache_negative(match: re.Match, line: str) -> str:
    return (f"LMCache 'need to load: {match.group(1)}' is benign: vLLM's own prefix cache "
            f"already holds more tokens than LMCache hit, so nothing is loaded")


def _engine_rank_died(match: re.Match, line: str) -> str:
    rank, how = match.group("who"), match.group("how")
    if how.startswith("was killed by signal"):
        cause = ("the kernel's OOM killer or an outside kill: check dmesg"
                 if "SIGKILL" in how else "check that rank's output for the cause")
    else:
        cause = "that rank's own output above shows why"
    return f"{rank} {how}: the engine stops with it; {cause}"


PATTERNS = [
    Pattern("watchdog_timeout", ("Watchdog caught collective operation timeout",),
            re.compile(r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"), _watchdog),
    Pattern("shm_broadcast_stalled", ("No available shared memory broadcast block",),
            re.compile(r"No available shared memory broadcast block found in (\d+) second"),
            _shm_broadcast),
    Pattern("out_of_memory", ("out of memory", "OutOfMemoryError"),
            re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError"), _oom),
    Pattern("cuda_error", ("CUDA error",), re.compile(r"CUDA error: ([^.;]+)"), _cuda_error),
    Pattern("lmcache_negative_load", ("need to load:",),
            re.compile(r"need to load: (-\d+)"), _lmcache_negative),
    Pattern("rank_died", ("rank ",),
            re.compile(r"(?P<who>rank \d+ \(pp \d+/\d+, tp \d+\)) "
                       r"(?P<how>was killed by signal \w+|exited with code -?\d+)"),
            _engine_rank_died),
]


def scan_file(path: str) -> Iterator[Finding]:
    """The findings of one file, in line order. Raises LogReadError first if the
    file cannot be read as text."""
    source = _open_text(path)
    return _scan(path, source)


def _open_text(path: str):
    if os.path.isdir(path):
        raise LogReadError(f"{path}: is a directory")
    try:
        source = open(path, "rb")
    except OSError as error:
        raise LogReadError(f"{path}: {error.strerror.lower()}") from None
    if b"\0" in source.read(SNIFF_BYTES):
        source.close()
        raise LogReadError(f"{path}: binary file, not a log")
    source.seek(0)
    return source


def _scan(path: str, source) -> Iterator[Finding]:
    with source:
        for number, raw in enumerate(source, start=1):
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            for pattern in PATTERNS:
                if not any(needle in line for needle in pattern.needles):
                    continue
                match = pattern.regex.search(line)
                if match is not None:
                    yield Finding(path, number, pattern.kind, pattern.explain(match, line),
                                  line.strip()[:MAX_TEXT])
                    break


def render(findings: list[Finding], console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    console = console or Console(highlight=False)
    for finding in findings:
        console.print(f"[bold]{escape(finding.path)}:{finding.line}[/] "
                      f"[yellow]{finding.kind}[/] {escape(finding.explanation)}")
    if not findings:
        console.print("no known failure pattern found")
