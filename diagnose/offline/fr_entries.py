"""One rank's Flight Recorder entries -> records, trusting nothing.

Every field the reader uses is checked for the type and range torch writes
(torch's own tests write seq ids as strings and dtypes as one string; both are
taken). One entry that fails makes the whole dump unreadable: a dump made by
hand or damaged on its way never gives a value the analysis chokes on (an
infinite time, a name that is a 100,000-deep list), and never a rank that
seems not to have made a call only because its entry was dropped.

Calls of a coalesced group (a `_coalescing_manager` block, an uneven
all_gather made of `_broadcast_oop`s, `batch_isend_irecv`) share one seq id.
Each collective call gets its place in its group as `part`; the dump's ring
may have dropped the start of its first group, whose parts are then unknown
(None). The entry that closes a batch of send/recv carries no call of its own
and is dropped.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

from diagnose.core.snapshot import CollectiveRecord
from diagnose.core.vocab import Op

GLOO_UNKNOWN = "gloo"       # a gloo entry's state until the reader settles it
TORCH_FRAMES = f"{os.sep}torch{os.sep}"
LATEST_NS = 1e30            # later than any clock; a time past it is damage
COALESCED_END = "coalesced"
# What one entry may hold: a pickle can reference one list from everywhere, so
# a small file can hold lists far longer than a recorder writes; past these
# the entry is skipped, and reading a dump stays linear in its size.
MAX_TENSORS = 1024
MAX_DIMS = 32
MAX_FRAMES = 64             # frames read for the call site


class BadEntry(ValueError):
    """An entry without the fields, types or ranges a dump has."""


@dataclass
class RankEntries:
    """One rank's entries: as records (their group still the pg name and their
    peer group-local), the pgs they name (pg name -> desc, the first seen), and
    the newest time they record."""
    records: list[CollectiveRecord]
    pgs: dict[str, str]
    newest: float | None


def records_of(entries: list) -> RankEntries:
    """The entries in the order the rank made them; BadEntry, naming the first
    that is not what torch writes."""
    numbered = []
    for index, entry in enumerate(entries):
        try:
            numbered.append((_record_id(entry), index, entry))
        except BadEntry as error:
            raise BadEntry(f"entry {index}: {error}") from None
    numbered.sort(key=lambda triple: triple[0])
    found = RankEntries([], {}, None)
    for _, index, entry in numbered:
        try:
            record = _record(entry, found)
        except BadEntry as error:
            raise BadEntry(f"entry {index}: {error}") from None
        if record is not None:
            found.records.append(record)
    _number_parts(found.records, wrapped=bool(numbered) and numbered[0][0] > 0)
    return found


def _record_id(entry) -> int:
    if type(entry) is not dict:
        raise BadEntry("not a dict")
    return _count(entry.get("record_id", 0))


def _record(entry: dict, found: RankEntries) -> CollectiveRecord | None:
    """This runs for every entry of every dump (2000 a rank by default), so the
    checks are plain type tests and the names and dtypes, which repeat, are
    parsed once."""
    get = entry.get
    pg = get("process_group")
    if not (type(pg) in (list, tuple) and len(pg) == 2 and _plain(pg[0]) and _plain(pg[1])):
        raise BadEntry("a process_group that is not (name, desc)")
    gloo, op, peer = _name(get("profiling_name"))
    if op == COALESCED_END and get("is_p2p") is True:
        return None                      # closes a batch of send/recv: no call of its own
    state = get("state")
    created = _seconds(get("time_created_ns"))
    if type(state) is not str or created is None:
        raise BadEntry("no state or no time_created_ns")
    completed = _seconds(get("time_discovered_completed_ns"))
    started = _seconds(get("time_discovered_started_ns"))
    newest = max(created, completed or 0.0, started or 0.0)
    if found.newest is None or newest > found.newest:
        found.newest = newest
    name = str(pg[0])
    if name not in found.pgs:
        found.pgs[name] = str(pg[1])
    done = state == "completed"
    return CollectiveRecord(
        group=name, seq=_count(get("collective_seq_id")), op=op, peer=peer,
        shapes=_sizes(get("input_sizes")), dtype=_dtypes(get("input_dtypes")),
        nbytes=0, site=_site(get("frames")),
        state=GLOO_UNKNOWN if gloo else "completed" if done else "enqueued",
        t_enqueue=created, t_complete=(completed or created) if done else None,
        out_shapes=_sizes(get("output_sizes")), out_dtype=_dtypes(get("output_dtypes")))


def _number_parts(records: list[CollectiveRecord], wrapped: bool) -> None:
    """Numbers the calls that share a seq in one group, in order. In a dump
    whose ring wrapped, the first group's earlier calls may be gone."""
    previous: dict[str, CollectiveRecord] = {}
    for record in records:
        if record.peer is not None:
            continue
        before = previous.get(record.group)
        if before is not None and before.seq == record.seq:
            record.part = None if before.part is None else before.part + 1
        elif wrapped and not previous:
            record.part = None
        previous[record.group] = record


def _plain(value) -> bool:
    return type(value) is str or type(value) is int


def _count(value) -> int:
    """A seq or record id: an int >= 0, or its digits (torch's tests write those)."""
    if type(value) is int and 0 <= value < 2 ** 63:
        return value
    if type(value) is str and value.isdigit() and len(value) < 19:
        return int(value)
    raise BadEntry("a count that is not a whole number >= 0")


def _seconds(value) -> float | None:
    """A time in ns as seconds; None for None; BadEntry for anything else."""
    if value is None:
        return None
    if type(value) is int and 0 <= value <= LATEST_NS:
        return value / 1e9
    if type(value) is float and math.isfinite(value) and 0 <= value <= LATEST_NS:
        return value / 1e9
    raise BadEntry("a time that is not a finite number of ns >= 0")


def _sizes(value) -> list[list[int]]:
    if value is None:
        return []
    if type(value) is not list or len(value) > MAX_TENSORS or not all(
            type(shape) is list and len(shape) <= MAX_DIMS
            and all(type(dim) is int for dim in shape) for shape in value):
        raise BadEntry("sizes that are not lists of whole numbers")
    return value


def _dtypes(value) -> str:
    """'Float' for ['Float'], 'Float,Half' for several, as given for a string."""
    if value is None:
        return ""
    if type(value) is str:
        return value
    if type(value) is not list or len(value) > MAX_TENSORS or not all(
            type(dtype) is str for dtype in value):
        raise BadEntry("dtypes that are not strings")
    return _joined(tuple(value))


@functools.lru_cache(maxsize=1024)
def _joined(dtypes: tuple[str, ...]) -> str:
    return ",".join(sorted(set(dtypes)))


def _name(value) -> tuple[bool, str, int | None]:
    """'nccl:send 0->1' -> (False, 'send', 1): gloo's, the op, the peer group-local."""
    if type(value) is not str:
        raise BadEntry("a profiling_name that is not a string")
    return _parse_name(value)


@functools.lru_cache(maxsize=4096)
def _parse_name(text: str) -> tuple[bool, str, int | None]:
    backend, _, name = text.partition(":")
    op, _, route = (name or backend).partition(" ")
    peer = None
    if op == Op.SEND and "->" in route:
        peer = _count(route.split("->")[1])
    elif op == Op.RECV and "<-" in route:
        peer = _count(route.split("<-")[1])
    return backend == "gloo", op, peer


def _site(frames) -> str:
    """The first frame outside torch: where the program called the collective."""
    if type(frames) is not list:
        return ""
    for frame in frames[:MAX_FRAMES]:
        if type(frame) is not dict:
            continue
        path, line, name = frame.get("filename"), frame.get("line"), frame.get("name")
        if not (type(path) is str and type(line) is int and type(name) is str):
            continue
        if TORCH_FRAMES not in path:
            return f"{_basename(path)}:{line} {name}"
    return ""


@functools.lru_cache(maxsize=4096)
def _basename(path: str) -> str:
    """The entries of a dump name the same few files over and over."""
    return os.path.basename(path)
