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
import sys
from dataclasses import dataclass, fields

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
# Sizes and call sites that records share: kept while there are fewer than
# MAX_SHARED, and only small ones, so that what is kept stays a few MB.
MAX_SHARED = 1 << 12
SHARED_TENSORS = 4
SHARED_CHARS = 512
_SHARED: dict[tuple, object] = {}    # sizes and call sites, by their values
_ints_only = frozenset({int}).issuperset
_strs_only = frozenset({str}).issuperset
_PAIRS, _PLAIN = (list, tuple), (str, int)


class BadEntry(ValueError):
    """An entry without the fields, types or ranges a dump has."""


# A record as a row of plain values, in the order the rank made the calls: what
# a worker process sends back. A row is a CollectiveRecord's fields in their
# order, so that the main process makes each record in one call as the rows
# come in; its group is still the pg name and its peer group-local
# (fr_groups.place settles both once every dump is read).
ROW_FIELDS = tuple(field.name for field in fields(CollectiveRecord))
SEQ, PART = ROW_FIELDS.index("seq"), ROW_FIELDS.index("part")


@dataclass
class RankEntries:
    """One rank's entries: as rows (their group still the pg name and their peer
    group-local), the pgs they name (pg name -> desc, the first seen), the
    newest time they record, and whether any is gloo's."""
    rows: list[tuple]
    pgs: dict[str, str]
    newest: float | None
    gloo: bool = False


def rows_of(entries: list) -> RankEntries:
    """The entries in the order the rank made them; BadEntry, naming the first
    that is not what torch writes. The calls that share a seq in one group are
    numbered in order (part); in a dump whose ring wrapped, the first group's
    earlier calls may be gone (None)."""
    numbered = []
    for index, entry in enumerate(entries):
        try:
            numbered.append((_record_id(entry), index, entry))
        except BadEntry as error:
            raise BadEntry(f"entry {index}: {error}") from None
    numbered.sort(key=_first)
    found = RankEntries([], {}, None)
    wrapped = bool(numbered) and numbered[0][0] > 0
    previous: dict[str, tuple] = {}      # pg name -> its last collective's row
    for _, index, entry in numbered:
        try:
            row = _row(entry, found, previous, wrapped)
        except BadEntry as error:
            raise BadEntry(f"entry {index}: {error}") from None
        if row is not None:
            found.rows.append(row)
    return found


def _first(triple: tuple) -> int:
    return triple[0]


def _record_id(entry) -> int:
    if type(entry) is not dict:
        raise BadEntry("not a dict")
    return _count(entry.get("record_id", 0))


def _row(entry: dict, found: RankEntries, previous: dict[str, tuple],
         wrapped: bool) -> tuple | None:
    """This runs for every entry of every dump (2000 a rank by default), so the
    checks are plain type tests, and what repeats (names, dtypes, shapes, call
    sites) is parsed once and shared."""
    get = entry.get
    pg = get("process_group")
    if not (type(pg) in _PAIRS and len(pg) == 2 and type(pg[0]) in _PLAIN
            and type(pg[1]) in _PLAIN):
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
    name = _text(pg[0])
    if name not in found.pgs:
        found.pgs[name] = str(pg[1])
    seq = _count(get("collective_seq_id"))
    part = 0
    if peer is None:
        before = previous.get(name)
        if before is not None and before[SEQ] == seq:
            part = None if before[PART] is None else before[PART] + 1
        elif wrapped and not previous:
            part = None
    if gloo:
        found.gloo = True
    done = state == "completed"
    row = (name, seq, op, peer, _sizes(get("input_sizes")), _dtypes(get("input_dtypes")), 0,
           _site(get("frames")), GLOO_UNKNOWN if gloo else "completed" if done else "enqueued",
           created, (completed or created) if done else None, False, None, None, part,
           _sizes(get("output_sizes")), _dtypes(get("output_dtypes")))
    if peer is None:
        previous[name] = row
    return row


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
    """The list itself, or for sizes seen before in this process the first such
    list: records share them, and a worker sends each once."""
    if value is None:
        return []
    if type(value) is not list or len(value) > MAX_TENSORS:
        raise BadEntry("sizes that are not lists of whole numbers")
    for shape in value:
        if type(shape) is not list or len(shape) > MAX_DIMS or not _ints_only(map(type, shape)):
            raise BadEntry("sizes that are not lists of whole numbers")
    if len(value) > SHARED_TENSORS:
        return value
    key = (len(value), *value[0]) if len(value) == 1 else (len(value), *map(tuple, value))
    shared = _SHARED.get(key)
    return shared if shared is not None else _shared(key, value)


def _shared(key, value):
    """`value`, kept for the next entries with the same `key` to share."""
    if len(_SHARED) >= MAX_SHARED:
        _SHARED.clear()
    _SHARED[key] = value
    return value


def _dtypes(value) -> str:
    """'Float' for ['Float'], 'Float,Half' for several, as given for a string."""
    if type(value) is list and len(value) == 1 and type(value[0]) is str:
        return sys.intern(value[0])
    if value is None:
        return ""
    if type(value) is str:
        return _text(value)
    if type(value) is not list or len(value) > MAX_TENSORS or not _strs_only(map(type, value)):
        raise BadEntry("dtypes that are not strings")
    if len(value) == 1:
        return _text(value[0])
    return _joined(tuple(value))



def _text(value) -> str:
    """A name that repeats in every entry, one object for all: a worker sends it once."""
    return sys.intern(value) if type(value) is str else str(value)


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
        path = frame.get("filename")
        if type(path) is not str or TORCH_FRAMES in path:
            continue
        line, name = frame.get("line"), frame.get("name")
        if type(line) is int and type(name) is str:
            if len(path) + len(name) > SHARED_CHARS:
                return _site_text(path, line, name)
            key = (path, line, name)
            shared = _SHARED.get(key)
            return shared if shared is not None else _shared(key, _site_text(path, line, name))
    return ""


def _site_text(path: str, line: int, name: str) -> str:
    return f"{os.path.basename(path)}:{line} {name}"
