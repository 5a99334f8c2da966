"""Collectives that timed out, compared across ranks: the rank behind.

NCCL's watchdog (PyTorch's ProcessGroupNCCL) prints, per rank and process
group, the collective that timed out and, in its status line, the last work
it enqueued and the last it completed:

    [Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5729, ...)
    [PG ID 4 PG GUID 67 Rank 3]  failure detected by watchdog at work sequence id: 5729
        PG status: last enqueued work: 6464, last completed work: 5728

Within one process group the rank whose last completed work is lowest is the
one behind. With TORCH_NCCL_DESYNC_DEBUG a rank also prints the desync report,
which names the lagging ranks itself. gloo has no watchdog: each waiting rank
raises its own "Timed out waiting" error and a rank that is not waiting prints
nothing, so the ranks the log shows to exist but that did not time out are the
ones the others waited for.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from diagnose.offline.logs.model import Event, Kind
from diagnose.offline.logs.rules import Rule

MAX_RECORDS = 4096

PG_TAG = re.compile(r"\[PG (?:ID )?(?P<pg>\d+)(?: PG GUID (?P<guid>\d+))?"
                    r"\s*(?:\((?P<name>[^)]*)\))? Rank (?P<rank>\d+)\]")
WATCHDOG = re.compile(r"\[Rank (?P<rank>\d+)\] Watchdog caught collective operation timeout: "
                      r"WorkNCCL\(SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)"
                      r"(?:.*?ran for (?P<ms>\d+) milliseconds)?")
STATUS = re.compile(r"(?:at work(?: sequence id)?|Timeout at NCCL work):? (?P<seq>-?\d+)[.,]?.*?"
                    r"last enqueued (?:NCCL )?work: (?P<enq>-?\d+), "
                    r"last completed (?:NCCL )?work: (?P<done>-?\d+)")
MISSED = re.compile(r"\[(?P<ranks>[\d, ]+)\] finished collective #(?P<seq>\d+), "
                    r"but didn't join collective #(?P<next>\d+)")
NEVER = re.compile(r"ranks \[(?P<ranks>[\d, ]+)\] are the lagging ranks")
ALL_JOINED = re.compile(r"\[(?P<ranks>[\d, ]+)\] joined but didn't finish collective #(?P<seq>\d+)")
TIMEOUT_AT = re.compile(r"\[(?P<rank>\d+)\] Timeout at collective: (?P<op>\w+), #(?P<seq>\d+)")
GLOO = re.compile(r"Timed out waiting (?P<ms>\d+)ms for (?P<op>\w+) operation")


@dataclass
class Record:
    group: str                   # "PG 4 (GUID 67)"; "gloo"; "" when the log does not say
    group_rank: int
    rank: int | None             # the global rank, when the line's prefix says it
    event: Event
    seq: int | None = None       # the work that timed out
    op: str | None = None
    ran_ms: int | None = None
    enqueued: int | None = None
    completed: int | None = None


@dataclass
class Desync:
    kind: str                    # missed | never_joined | all_joined
    ranks: list[int]
    seq: int | None
    event: Event


@dataclass
class Collectives:
    records: dict[tuple, Record] = field(default_factory=dict)
    desyncs: list[Desync] = field(default_factory=list)
    reporter: tuple[int, str, int] | None = None   # the desync report's own rank, op, collective

    def record(self, group: str, group_rank: int, rank: int | None, event: Event) -> Record:
        """The record of one rank in one group; a line that names no group is kept
        apart per process until its status line names it."""
        pending = ("", event.proc.key, group_rank)
        key = (group, group_rank) if group else pending
        found = self.records.get(key)
        if found is None and group:
            found = self.records.pop(pending, None)
            if found is not None:
                found.group = group
                self.records[key] = found
        if found is None and len(self.records) < MAX_RECORDS:
            found = self.records[key] = Record(group, group_rank, rank, event)
        return found if found is not None else Record(group, group_rank, rank, event)

    def gloo(self, event: Event, rank: int | None, message: str) -> None:
        found = GLOO.search(message)
        if rank is not None and found:
            record = self.record("gloo", rank, rank, event)
            record.op, record.ran_ms = found["op"], int(found["ms"])


def _group(tag: re.Match | None) -> str:
    if tag is None:
        return ""
    name = f" {tag['name']}" if tag["name"] else ""
    guid = f" (GUID {tag['guid']})" if tag["guid"] and tag["guid"] != tag["pg"] else ""
    return f"PG {tag['pg']}{guid}{name}"


def _ranks(text: str) -> list[int]:
    return [int(rank) for rank in text.replace(" ", "").split(",") if rank]


def _watchdog(scan, line, proc):
    tag, found = PG_TAG.search(line.body), WATCHDOG.search(line.body)
    if found:
        event = scan.emit(Kind.COLLECTIVE_TIMEOUT, line, proc, backend="nccl")
        group_rank = int(tag["rank"]) if tag else int(found["rank"])
        record = scan.collectives.record(_group(tag), group_rank, proc.rank, event)
        record.seq, record.op = int(found["seq"]), found["op"]
        record.ran_ms = int(found["ms"]) if found["ms"] else record.ran_ms


def _status(scan, line, proc):
    tag, found = PG_TAG.search(line.body), STATUS.search(line.body)
    if tag and found:
        event = scan.emit(Kind.COLLECTIVE_TIMEOUT, line, proc, backend="nccl")
        record = scan.collectives.record(_group(tag), int(tag["rank"]), proc.rank, event)
        record.enqueued, record.completed = int(found["enq"]), int(found["done"])
        record.seq = record.seq if record.seq is not None else int(found["seq"])


def _desync(scan, line, proc):
    found = TIMEOUT_AT.search(line.body)
    if found:
        scan.collectives.reporter = (int(found["rank"]), found["op"], int(found["seq"]))
        return
    for pattern, kind in ((MISSED, "missed"), (NEVER, "never_joined"), (ALL_JOINED, "all_joined")):
        found = pattern.search(line.body)
        if found and len(scan.collectives.desyncs) < 64:
            event = scan.emit(Kind.COLLECTIVE_TIMEOUT, line, proc, backend="nccl", desync=kind)
            seq = found.groupdict().get("next") or found.groupdict().get("seq")
            scan.collectives.desyncs.append(Desync(kind, _ranks(found["ranks"]),
                                                   int(seq) if seq else None, event))
            for rank in _ranks(found["ranks"]):
                scan.job.saw_rank(rank)


NCCL_RULES = (
    Rule(("Watchdog caught collective operation timeout",), _watchdog),
    Rule(("last enqueued",), _status),
    Rule(("didn't join collective", "are the lagging ranks",
          "joined but didn't finish collective", "Timeout at collective:"), _desync),
)
