"""The pass over the files: every line once, in order, in bounded memory.

A line is parsed only when it can matter: when it holds one of the anchors
(prefilter.py), or while its process is in the middle of a traceback (then
only its message is decoded, and the indented lines not even that until the
exception line comes). What the lines tell is kept as events, collapsed as they
come: one entry per kind, process and message, with a count and the first and
last time, and at most MAX_KEYS entries.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from diagnose.offline.logs import prefilter
from diagnose.offline.logs.collectives import Collectives
from diagnose.offline.logs.model import Event, Kind, Proc
from diagnose.offline.logs.processes import Job, Processes
from diagnose.offline.logs.reader import Line, parse, trim
from diagnose.offline.logs.rules import classify
from diagnose.offline.logs.tracebacks import Assembler, PyError

MAX_KEYS = 512             # distinct (kind, process, message) entries kept
MAX_BUSY_LINES = 5000      # a traceback unfinished this many lines later is dropped
INDENT = (b" ", b"\t")
MAX_OPEN = 256             # processes with a traceback under way; the oldest is closed beyond
LAST_LINE = 200            # bytes kept of each torchrun rank's last line
COLOR = re.compile(rb"\x1b\[[0-9;]*m")
HEAD = re.compile(rb" ?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL) \d\d-\d\d \d\d:\d\d:\d\d(?:[.,]\d+)? "
                  rb"\[?[\w./-]+:\d+\] ?")
VLLM_NAME = re.compile(rb"\(([A-Za-z][\w-]*)(?: rank=\d+)?(?: engine_index=\d+)? pid=(\d+)"
                       rb"(?:, ip=[\d.:]+)?\) ?")
TORCHRUN_RANKS = re.compile(rb"(?:\[(?!rank\d)[A-Za-z_]\w*?(\d+)\]:)?(?:\[rank(\d+)\]: ?)?")


@dataclass(eq=False)
class Entry:
    """Every event of one kind, process and message: the first one, and how many."""
    first: Event
    count: int = 1
    last: Event | None = None

    @property
    def latest(self) -> Event:
        return self.last or self.first


@dataclass
class Scanner:
    job: Job = field(default_factory=Job)
    collectives: Collectives = field(default_factory=Collectives)
    files: list[str] = field(default_factory=list)
    entries: dict[tuple, Entry] = field(default_factory=dict)
    dropped: int = 0                          # events beyond MAX_KEYS
    summary_rank: int | None = None           # torchrun's failure summary: the rank it describes
    torchrun_root: int | None = None          # the rank torchrun calls "Root Cause"
    torchrun_root_next: bool = False

    def __post_init__(self):
        self.procs = Processes(self.job)
        self.assemblers: dict[tuple, Assembler] = {}
        self.busy: dict[tuple, int] = {}       # processes in a traceback -> the line last fed
        self.owners: dict[tuple, int] = {}     # our engine's "[rank 1] worker failed:" headers
        self.names: dict[bytes, bytes] = {}    # vLLM pid -> the name its last line carried
        self.prefix: tuple[bytes, tuple] | None = None   # the last traceback line's prefix
        self.file = 0
        self.carried: float | None = None      # the last time seen in this file

    def scan(self, path: str, chunks: Iterable[list[bytes]]) -> None:
        """Every line of one file (given as lists of lines, see reader.chunks)."""
        self.file, self.carried, self.names = len(self.files), None, {}
        self.files.append(path)
        number = 0
        busy = self.busy
        for lines in chunks:
            blob = b"\n".join(lines)
            hits = prefilter.hits(blob, lines)
            self._names(blob)
            for index, raw in enumerate(lines):
                number += 1
                hit = hits.get(index)
                if not (hit or busy or raw[:1] == b"["):
                    continue
                if (not hit and self.prefix and raw.startswith(self.prefix[0])
                        and self.prefix[1] in busy):
                    # the next line of the traceback just read: same prefix, same process
                    if self._traceback_body(number, raw, self.prefix[1], len(self.prefix[0])):
                        continue
                    self.line(parse(number, raw), prefilter.ALL_ANCHORS)
                    continue
                key, start = self._who(number, raw)
                if not hit:
                    if key not in busy:
                        continue
                    if raw[:1] == b"\x1b":
                        raw = COLOR.sub(b"", raw)
                    if self._traceback_line(number, raw, key, start):
                        continue
                self.line(parse(number, raw), hit or prefilter.ALL_ANCHORS)
            if self.busy:
                self._drop_stale(number)
        for key in list(self.assemblers):
            self._close(key)
        self.owners.clear()

    def _names(self, blob: bytes) -> None:
        """vLLM renames a worker as it starts (VllmWorker-1, Worker, Worker_TP1): every
        name a pid had, from every line of the chunk, in one regex pass."""
        for name, pid in dict.fromkeys(prefilter.NAMES.findall(b"\n" + blob)):
            if self.names.get(pid) != name:
                if len(self.names) > 4 * MAX_KEYS:
                    self.names.clear()
                self.names[pid] = name
                self.procs.named(self.file, int(pid), name.decode())

    def _who(self, number: int, raw: bytes) -> tuple[tuple, int]:
        """Who printed the line, read cheaply off its prefix (a traceback under way needs
        its process's lines), and where the prefix ends; torchrun's ranks are noted on
        the way."""
        first = raw[:1]
        if first == b"\x1b":
            raw = COLOR.sub(b"", raw)
            first = raw[:1]
        if first == b"(":
            found = VLLM_NAME.match(raw)
            if found:
                return (self.file, "pid", int(found.group(2))), found.end()
        elif first == b"[":
            found = TORCHRUN_RANKS.match(raw)
            if found.end():
                rank = int(found.group(2) or found.group(1))
                self.job.saw_rank(rank)
                if rank in self.job.ranks:
                    self.job.last_lines[rank] = (self.file, number, raw[:LAST_LINE])
                return (self.file, "rank" if found.group(2) else "local", rank), found.end()
        return (self.file, "out"), 0

    def _close(self, key: tuple) -> None:
        """Forget a process's traceback state; an error it was holding is kept."""
        self.busy.pop(key, None)
        if self.prefix and self.prefix[1] == key:
            self.prefix = None
        error = self.assemblers.pop(key).flush()
        if error is not None:
            self._error(key, error)

    def line(self, line: Line, anchors=prefilter.ALL_ANCHORS) -> None:
        """One parsed line: to its process's traceback, or to the rules its anchors name."""
        if line.when is not None:
            self.carried = line.when
        proc = self.procs.of(self.file, line)
        key = proc.key
        assembler = self.assemblers.get(key)
        if assembler is None:
            if "Traceback" not in line.body:
                self._rules(line, proc, anchors)
                return
            if len(self.assemblers) >= MAX_OPEN:
                self._close(next(iter(self.assemblers)))
            assembler = self.assemblers[key] = Assembler()
        used, error = assembler.feed(line.body, line.number, line.text)
        done = assembler.done
        if done is not None and done.line == line.number:
            done.when, done.stamp = line.when if line.when is not None else self.carried, line.stamp
        if error is not None:
            self._error(key, error)
        if assembler.busy:
            self.busy[key] = line.number
        else:
            self._settle(key, assembler)
        if not used:
            self._rules(line, proc, anchors)

    def _traceback_line(self, number: int, raw: bytes, key: tuple, start: int) -> bool:
        """A line of a traceback under way, read without parsing the whole line
        (most lines of a log that holds tracebacks are theirs); False when the
        line turns out to need the full parse."""
        head = HEAD.match(raw, start)
        if head is None and key[1] == "pid":
            return False          # not vLLM's usual level and time: the full parse reads it
        end = head.end() if head else start
        if end:
            self.prefix = (raw[:end], key)
        return self._traceback_body(number, raw, key, end)

    def _traceback_body(self, number: int, raw: bytes, key: tuple, end: int) -> bool:
        assembler = self.assemblers[key]
        if raw[end:end + 1] in INDENT and assembler.state == "frames":
            assembler.hold(raw[end:])      # a frame, its code or carets: read when needed
            self.busy[key] = number
            return True
        body = raw[end:].decode("utf-8", "replace").rstrip("\r")
        state = assembler.state
        used, error = assembler.feed(body, number, "")
        if error is not None:
            self._error(key, error)
        done = assembler.done
        if not used or (done is not None and done.line == number) or assembler.state != state:
            # the exception line, a change of state or a line for the rules: undo nothing,
            # but let the full parse fill in what the quick one skipped
            if done is not None and done.line == number:
                line = parse(number, raw)
                done.text = line.text
                done.when = line.when if line.when is not None else self.carried
                done.stamp = line.stamp
            self._settle(key, assembler)
            return used
        return True

    def _settle(self, key: tuple, assembler: Assembler) -> None:
        if assembler.busy:
            return
        self.busy.pop(key, None)
        if self.prefix and self.prefix[1] == key:
            self.prefix = None
        if assembler.state == "idle":
            del self.assemblers[key]

    def _rules(self, line: Line, proc: Proc, anchors) -> None:
        body, done = line.body, set()
        for anchor in anchors:
            for rule in prefilter.ANCHOR_RULES[anchor]:
                if rule in done:
                    continue
                done.add(rule)
                if any(needle in body for needle in rule.needles):
                    rule.read(self, line, proc)

    def emit(self, kind: Kind, line: Line, proc: Proc, **info) -> Event:
        event = Event(kind, self.file, line.number,
                      line.when if line.when is not None else self.carried,
                      line.stamp, proc, trim(line.text), info)
        self._keep(event)
        return event

    def owner(self, line: Line, rank: int) -> None:
        if len(self.owners) >= MAX_OPEN:
            self.owners.clear()
        self.owners[(self.file,) + line.key] = rank

    def _error(self, key: tuple, error: PyError) -> None:
        proc = self.procs.table.get(key) or Proc(key=key)
        owner = self.owners.pop(key, None)
        if owner is not None:
            proc = self.procs.of(self.file, Line(0, ("rank", owner), None, None, owner, None,
                                                 None, None, None, "", ""))
        kind, info = classify(error)
        event = Event(kind, self.file, error.line, error.when, error.stamp, proc, trim(error.text),
                      {**info, "exception": error, "traceback": True})
        if kind == Kind.COLLECTIVE_TIMEOUT:
            self.collectives.gloo(event, proc.rank, error.message)
        self._keep(event)

    def _keep(self, event: Event) -> None:
        key = (event.kind, event.proc.label(), detail(event))
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= MAX_KEYS:
                self.dropped += 1
                return
            self.entries[key] = Entry(event)
            return
        latest = entry.latest
        if (event.info.get("traceback") and event.stamp == latest.stamp
                and event.file == latest.file):
            return       # the same traceback printed twice (vLLM's worker does) is one failure
        entry.count += 1
        entry.last = event

    def _drop_stale(self, number: int) -> None:
        """Forget the tracebacks that never ended (a process that died mid-print)."""
        for key, fed in list(self.busy.items()):
            if number - fed > MAX_BUSY_LINES:
                self._close(key)


def detail(event: Event) -> tuple:
    """What tells one event of a kind and process from another (the collapse key)."""
    error = event.info.get("exception")
    if isinstance(error, PyError):
        return (error.type, error.message[:120], error.frame.where() if error.frame else None)
    info = event.info
    if event.kind == Kind.HTTP_ERROR:
        return (info["status"], info["method"], info["path"])
    if event.kind in (Kind.CUDA_ERROR, Kind.NCCL_WARNING):
        return (re.sub(r"\d+", "N", info.get("cuda") or info.get("message") or ""),)
    if event.kind in (Kind.RANK_DIED, Kind.WORKER_DIED):
        return (info.get("who") or info.get("worker"), info.get("how") or info.get("code"))
    if event.kind == Kind.JOB_STOPPED:
        return (info.get("rank"), info.get("signal"))
    return ()
