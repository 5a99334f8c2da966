"""The pass over the files: every line once, in order, in bounded memory.

A line is parsed only when it can matter: when one of the rules' substrings
is in it (one regex over the raw bytes), or while some process is in the
middle of a traceback. What the lines tell is kept as events, collapsed as
they come: one entry per kind, process and message, with a count and the
first and last time, and at most MAX_KEYS entries.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from diagnose.offline.logs.collectives import NCCL_RULES, Collectives
from diagnose.offline.logs.model import Event, Kind, Proc
from diagnose.offline.logs.processes import Job, Processes
from diagnose.offline.logs.reader import Line, parse, trim
from diagnose.offline.logs.rules import LINE_RULES, TRACEBACK_NEEDLES, classify
from diagnose.offline.logs.tracebacks import Assembler, PyError

MAX_KEYS = 512             # distinct (kind, process, message) entries kept
MAX_BUSY_LINES = 5000      # a traceback unfinished this many lines later is dropped
MAX_OPEN = 256             # processes with a traceback under way; the oldest is closed beyond
LAST_LINE = 200            # bytes kept of each torchrun rank's last line
RULES = LINE_RULES + NCCL_RULES
NEEDLES = [needle for rule in RULES for needle in rule.needles] + list(TRACEBACK_NEEDLES)
PREFILTER = re.compile(b"|".join(re.escape(needle.encode()) for needle in NEEDLES))
VLLM_NAME = re.compile(rb"\(([A-Za-z][\w-]*)(?: rank=\d+)?(?: engine_index=\d+)? pid=(\d+)")
TORCHRUN_RANKS = re.compile(rb"(?:\[(?!rank\d)[A-Za-z_]\w*?(\d+)\]:)?(?:\[rank(\d+)\]:)?")


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
        self.file = 0
        self.carried: float | None = None      # the last time seen in this file

    def scan(self, path: str, raw_lines: Iterable[bytes]) -> None:
        self.file, self.carried = len(self.files), None
        self.files.append(path)
        search, ranks, vllm = PREFILTER.search, TORCHRUN_RANKS.match, VLLM_NAME.match
        names: dict[bytes, bytes] = {}          # pid -> the name its last line carried
        for number, raw in enumerate(raw_lines, start=1):
            first = raw[:1]
            if first == b"(":
                found = vllm(raw)
                if found and names.get(found.group(2)) != found.group(1):
                    if len(names) > 4 * MAX_KEYS:
                        names.clear()
                    names[found.group(2)] = found.group(1)
                    self.procs.named(self.file, int(found.group(2)), found.group(1).decode())
            elif first == b"[":
                found = ranks(raw)
                if found.end():
                    rank = int(found.group(2) or found.group(1))
                    self.job.saw_rank(rank)
                    if rank in self.job.ranks:
                        self.job.last_lines[rank] = (self.file, number, raw[:LAST_LINE])
            if not self.busy and not search(raw):
                continue
            self.line(parse(number, raw))
            if self.busy and number % 1024 == 0:
                self._drop_stale(number)
        for key in list(self.assemblers):
            self._close(key)
        self.owners.clear()

    def _close(self, key: tuple) -> None:
        """Forget a process's traceback state; an error it was holding is kept."""
        self.busy.pop(key, None)
        error = self.assemblers.pop(key).flush()
        if error is not None:
            self._error(key, error)

    def line(self, line: Line) -> None:
        if line.when is not None:
            self.carried = line.when
        proc = self.procs.of(self.file, line)
        key = proc.key
        assembler = self.assemblers.get(key)
        if assembler is None:
            if "Traceback" not in line.body:
                self._rules(line, proc)
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
            self.busy.pop(key, None)
            if assembler.state == "idle":
                del self.assemblers[key]
        if not used:
            self._rules(line, proc)

    def _rules(self, line: Line, proc: Proc) -> None:
        body = line.body
        for rule in RULES:
            for needle in rule.needles:
                if needle in body:
                    rule.read(self, line, proc)
                    break

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
        key = (event.kind, event.proc.label(), _detail(event))
        entry = self.entries.get(key)
        if entry is None:
            if len(self.entries) >= MAX_KEYS:
                self.dropped += 1
                return
            self.entries[key] = Entry(event)
            return
        latest = entry.latest
        if event.info.get("traceback") and event.stamp == latest.stamp and event.file == latest.file:
            return       # the same traceback printed twice (vLLM's worker does) is one failure
        entry.count += 1
        entry.last = event

    def _drop_stale(self, number: int) -> None:
        for key, fed in list(self.busy.items()):
            if number - fed > MAX_BUSY_LINES:
                self._close(key)


def _detail(event: Event) -> tuple:
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
