"""Reading a log: a check that it is text, then one line at a time, its prefixes
taken apart.

The prefixes say who printed a line and when:

    (Worker_PP1_TP0 pid=16810) ERROR 12-01 05:29:58 [multiproc_executor.py:1063] msg
    (VllmWorker rank=2 pid=4242) ...                      vLLM, older
    [default1]:[rank1]: msg                               torchrun --tee, and PyTorch's rank
    [rank0]:[E515 18:36:47.341808597 ProcessGroupNCCL.cpp:632] msg
    W1201 05:33:50.647000 18062 torch/distributed/elastic/.../api.py:1028] msg
    host:534:1763 [3] NCCL INFO msg                       NCCL (the [3] is the CUDA device)
    [2025-06-21 20:59:57,672] LMCache INFO: msg

A line's time is kept as seconds into the year (the logs print no year) and
as "MM-DD HH:MM:SS" for people.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

SNIFF_BYTES = 8192       # how much of a file decides whether it is text
CHUNK = 1 << 20          # bytes read at a time
MAX_LINE = 16384         # bytes of a line kept; the rest of a longer line is skipped
MAX_TEXT = 300           # characters of a line kept in a finding
TEXT_BYTES = frozenset(b"\t\n\r\f\b\x1b") | frozenset(range(32, 256))


class LogReadError(Exception):
    """A file that cannot be read as a log: missing, a directory, unreadable or binary."""


def open_text(path: str):
    """The file opened for binary reading, or LogReadError saying why it cannot be a log."""
    if os.path.isdir(path):
        raise LogReadError(f"{path}: is a directory")
    try:
        source = open(path, "rb")
        head = source.read(SNIFF_BYTES)
    except OSError as error:
        raise LogReadError(f"{path}: {(error.strerror or str(error)).lower()}") from None
    if b"\0" in head or sum(byte not in TEXT_BYTES for byte in head) > len(head) // 10:
        source.close()
        raise LogReadError(f"{path}: binary file, not a log")
    source.seek(0)
    return source


def chunks(source):
    """The file as lists of its lines (bytes, without the newline), about CHUNK
    bytes at a time; a line longer than MAX_LINE is cut there. Memory stays at
    one chunk whatever the file holds (one endless line too)."""
    rest, skipping = b"", False
    while True:
        block = source.read(CHUNK)
        if not block:
            break
        lines = block.split(b"\n")
        if skipping:
            if len(lines) == 1:
                continue
            lines[0], skipping = rest, False
        else:
            lines[0] = rest + lines[0]
        rest = lines.pop()
        if len(rest) > MAX_LINE:
            rest, skipping = rest[:MAX_LINE], True
        if lines:
            yield lines
    if rest:
        yield [rest]


def raw_lines(source):
    """The file's lines, one at a time (see chunks)."""
    for lines in chunks(source):
        yield from lines


@dataclass(slots=True)
class Line:
    number: int
    key: tuple                 # who printed it, within its file
    name: str | None           # vLLM's process name, "torchrun", or None
    pid: int | None
    rank: int | None           # a global rank the prefix states
    local_rank: int | None     # torchrun --tee's [default3]:
    host: str | None
    when: float | None
    stamp: str | None
    body: str                  # the message, prefixes taken off
    text: str                  # the whole line


ANSI = re.compile(r"\x1b\[[0-9;]*m")
VLLM_PROC = re.compile(r"\((?P<name>[A-Za-z][\w-]*)(?: rank=(?P<rank>\d+))?(?: engine_index=\d+)?"
                       r" pid=(?P<pid>\d+)(?:, ip=[\d.:]+)?\) ?")
TEE = re.compile(r"\[(?!rank\d)[A-Za-z_]\w*?(?P<local>\d+)\]:")
RANK = re.compile(r"\[rank(?P<rank>\d+)\]: ?")
VLLM_HEAD = re.compile(r"(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) (?P<mo>\d\d)-(?P<d>\d\d) "
                       r"(?P<hms>\d\d:\d\d:\d\d)(?:[.,]\d+)? \[?[\w./-]+:\d+\] ?")
GLOG = re.compile(r"\[?[IWEF](?:(?P<mo>\d\d)(?P<d>\d\d) (?P<hms>\d\d:\d\d:\d\d)(?P<frac>\.\d+)?"
                  r"(?: +(?P<pid>\d+))?)? ?[\w./-]+:\d+\] ?")
ISO = re.compile(r"\[?\d{4}-(?P<mo>\d\d)-(?P<d>\d\d)[ T](?P<hms>\d\d:\d\d:\d\d)"
                 r"(?P<frac>[.,]\d+)?\]? ?")
NCCL = re.compile(r"(?P<host>[\w.-]+):(?P<pid>\d+):\d+ \[(?P<dev>\d+)\] ")


def parse(number: int, raw: bytes) -> Line:
    text = raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r")
    if "\x1b" in text:
        text = ANSI.sub("", text)
    rest, key, name, pid, rank, local, host = text, ("out",), None, None, None, None, None
    found = VLLM_PROC.match(rest)
    if found:
        name, pid = found["name"], int(found["pid"])
        rank = int(found["rank"]) if found["rank"] else None
        key, rest = ("pid", pid), rest[found.end():]
    found = TEE.match(rest)
    if found:
        local = int(found["local"])
        key, rest = ("local", local), rest[found.end():]
    found = RANK.match(rest)
    if found:
        rank = int(found["rank"])
        key, rest = ("rank", rank), rest[found.end():]
    when = stamp = None
    for pattern in (VLLM_HEAD, GLOG, ISO):
        found = pattern.match(rest)
        if found and (pattern is not GLOG or found["hms"] or rank is not None):
            if found["hms"]:
                when, stamp = _time(found)
            if pattern is GLOG and found["pid"] and key == ("out",):
                pid = int(found["pid"])
                key = ("pid", pid)
            rest = rest[found.end():]
            break
    else:
        found = NCCL.match(rest) if key == ("out",) else None
        if found:
            host, pid = found["host"], int(found["pid"])
            key, name, rest = ("pid", pid, host), "NCCL", rest[found.end():]
    return Line(number, key, name, pid, rank, local, host, when, stamp, rest, text)


_TIMES: dict[tuple, tuple[float, str]] = {}     # a second seen before costs a lookup


def _time(found: re.Match) -> tuple[float, str]:
    frac = found.groupdict().get("frac")
    key = (found["mo"], found["d"], found["hms"])
    known = _TIMES.get(key)
    if known is None:
        if len(_TIMES) > 4096:
            _TIMES.clear()
        known = _TIMES[key] = _seconds(*key)
    if not frac:
        return known
    return known[0] + float("0." + frac[1:]), known[1]


def _seconds(mo: str, d: str, hms: str) -> tuple[float, str]:
    month, day = int(mo), int(d)
    hours, minutes, seconds = int(hms[:2]), int(hms[3:5]), int(hms[6:8])
    when = ((month - 1) * 31 + day - 1) * 86400 + hours * 3600 + minutes * 60 + seconds
    return float(when), f"{month:02d}-{day:02d} {hms}"


def trim(text: str) -> str:
    text = text.strip()
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT - 1] + "…"
