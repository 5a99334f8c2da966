"""An agent's reports as changes: what crosses the node link after the first report.

The first report on a link, and any after the head asked for it, is whole: every
rank's state as `dataclasses.asdict` writes it, but groups as ranges and each
list's items as rows (an item's fields' values, in order: the head checks a row
without making a dict of it). The head keeps that form (`Known.wire`) and writes
it to the node's file. Every other report is
a delta on the last report the head applied (`base`, its `seq`):

    {"seq": 8, "base": 7,
     "ranks": {rank: whole state},            ranks new to the node
     "gone": [rank, ...],                     ranks no longer on it
     "changes": {rank: {"set": {field: value},
                        "lists": {field: [had, drop, keep, added]}}},  added: each item
                                                                    its fields' values, in order
     "beats": [[heartbeat_at, "0-511,513"], ...],   every rank's, one map
     "progress": [[progress_at, "3,9-12"], ...]}    ranks whose rings it held back

A list field (a ring of phases or records) becomes old[drop:drop + keep] + added,
`had` being the length the agent knew: a healthy rank's report is its new
records, a hung one's its heartbeat.

The reports of all nodes carry at most HEAD_RING_ITEMS items a launcher poll of
the rings (RINGS) of ranks that moved in the last MOVING_S, each node its share
(`ring_items`, `node_share`), saved up over reports while a rank's rings are
more than one report's share: those whose rings the head has held longest go
first, and the others hold back their rings and ring count (HELD_VALUES) and
send their last progress instead, to a tenth of a second (`progress_at`, which
the analysis takes as progress, and until which alone it judges the rank,
`position.seen_until`). A rank still for MOVING_S, dead or raising sends its
rings whatever their size: the head has a stalled rank's rings well within the
shortest stall limit, and counts its stall from its last progress, so the
verdict comes as soon as it would have. A node of 1,024 ranks that step
brings the head a small part of their records, and a report stays about as
cheap as a small node's. The head applies a delta whole or not at
all (`Known.apply`): a delta on a state the head lacks, or anything malformed,
is a `ValueError`, and the head asks for a whole report instead. Every value it
keeps is checked as the files' are (diagnose/core/checked.py); no object it has
handed out is modified, so a snapshot may hold them while reports arrive.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from functools import partial
from operator import attrgetter, eq

from diagnose.analysis.position import last_progress
from diagnose.core.checked import checked, field_checks, row_check
from diagnose.core.groups import GroupReader, encode as encode_groups
from diagnose.core.layout import parse_ranks, rank_ranges
from diagnose.core.rows import as_row, built_list
from diagnose.core.snapshot import (CollectiveRecord, CpuWait, Identity, PhaseEvent, RankState,
                                    WorkerExit)

ITEMS = {"phases": PhaseEvent, "collectives": CollectiveRecord, "open_phases": PhaseEvent,
         "cpu_waits": CpuWait, "worker_exits": WorkerExit}    # a list field's items
LISTS = tuple(ITEMS)
ROW_CHECKS = {name: row_check(item) for name, item in ITEMS.items()}
ITEM_CHECKS = {name: partial(checked, item) for name, item in ITEMS.items()}
FIELDS_OF = attrgetter("__dict__")
RINGS = ("phases", "collectives", "open_phases")   # what a moving rank may hold back,
HELD_VALUES = ("ring_read",)                        # with the count that moves with them
BEAT, PROGRESS = "heartbeat_at", "progress_at"
VALUES = tuple(f.name for f in fields(RankState) if f.name not in LISTS + (BEAT, PROGRESS))
HEAD_RING_ITEMS = 8192        # a probe's rank holds 128 (64 phases, 64 records)
MOVING_S = 1.0                # half the shortest stall limit (Thresholds.floor_s)
CHECKS = field_checks(RankState)


# -- the agent -----------------------------------------------------------------

def _key(value) -> object:
    """What tells a field's value changed: a dataclass by its fields' values (taken
    now: the probe's objects change in place), anything else itself."""
    return tuple(value.__dict__.values()) if hasattr(value, "__dataclass_fields__") else value


def _rank_keys(state: RankState, before: tuple[dict, dict] | None) -> tuple[dict, dict]:
    """What was sent of a rank: its values' keys, and each list's items as copies of
    their fields. A list whose items still equal the copies sent `before` keeps
    them: compared in C, without a copy (a hung node's report is its heartbeats)."""
    values = {name: _key(getattr(state, name)) for name in VALUES}
    lists = {}
    for name in LISTS:
        items, old = getattr(state, name), before[1][name] if before else None
        if old is not None and len(old) == len(items) and all(map(eq, map(FIELDS_OF, items), old)):
            lists[name] = old
        else:
            lists[name] = list(map(dict, map(FIELDS_OF, items)))
    return values, lists


def _list_change(old: list, new: list) -> tuple[int, int] | None:
    """(drop, keep) such that new == old[drop:drop + keep] + new[keep:]; None if
    nothing changed. A ring that moved on keeps its overlap; an item that changed
    in place (a phase that ended) is sent again with those after it."""
    if old == new:
        return None
    if not new or new[0] not in old:
        return len(old), 0
    drop = old.index(new[0])
    keep, limit = 0, min(len(old) - drop, len(new))
    while keep < limit and old[drop + keep] == new[keep]:
        keep += 1
    return drop, keep


def _wire(name: str, value, encoded: dict[int, str]):
    """A field's value as it crosses: asdict's form, groups as ranges, each list
    of members encoded once (`encoded`, by the list's id: a node's ranks share them),
    a list's items as rows (their fields' values in order: checked without a dict)."""
    if name == "identity":
        return {**{f.name: getattr(value, f.name) for f in fields(Identity)},
                "groups": encode_groups(value.groups, encoded)}
    if name in LISTS:            # their items are flat: their fields are JSON already
        return [as_row(item) for item in value]
    return asdict(value) if hasattr(value, "__dataclass_fields__") else value


def whole(state: RankState, encoded: dict[int, str]) -> dict:
    body = {name: _wire(name, getattr(state, name), encoded) for name in VALUES + LISTS}
    body[BEAT], body[PROGRESS] = state.heartbeat_at, None
    return body


@dataclass
class Sent:
    seq: int
    keys: dict[int, tuple[dict, dict]]     # rank -> _rank_keys: what was sent of it


def node_share(agents: int) -> int:
    """One node's ring items a report, of the head's HEAD_RING_ITEMS."""
    return max(1, HEAD_RING_ITEMS // max(1, agents))


class ReportWriter:
    """An agent's side: the next report, whole or as the changes since the last
    one the head applied (`applied` says which it did); None for `ring_items`
    sends every ring change."""

    def __init__(self, ring_items: int | None):
        self.ring_items = ring_items
        self.credit = 0                    # ring items saved up for moving ranks' rings
        self.acked: Sent | None = None     # the last report the head applied
        self.pending: Sent | None = None   # the one on its way
        self.seq = 0
        self.rings_sent: dict[int, int] = {}   # rank -> the seq whose report last sent its rings

    def report(self, ranks: dict[int, RankState], now: float, complete: bool = False) -> dict:
        """The next report, as of `now` (time.time()); `complete`: no ring held
        back (the node's last)."""
        self.seq += 1
        before = self.acked.keys if self.acked is not None else {}
        keys = {rank: _rank_keys(state, before.get(rank)) for rank, state in ranks.items()}
        encoded: dict[int, str] = {}
        if self.acked is None:
            self.pending = Sent(self.seq, keys)
            self.rings_sent = dict.fromkeys(ranks, self.seq)
            return {"seq": self.seq, "base": None,
                    "ranks": {str(rank): whole(state, encoded) for rank, state in ranks.items()}}
        held = ({} if complete or self.ring_items is None
                else self._held_back(ranks, now, before, keys))
        for rank in held:
            values, lists = keys[rank]
            keys[rank] = (values | {name: before[rank][0][name] for name in HELD_VALUES},
                          lists | {name: before[rank][1][name] for name in RINGS})
        self.pending = Sent(self.seq, keys)
        changes = {}
        for rank, state in ranks.items():
            if rank in before:
                change = _changes(state, before[rank], keys[rank], encoded)
                if change:
                    changes[str(rank)] = change
                if not change.get("lists", {}).keys().isdisjoint(RINGS):
                    self.rings_sent[rank] = self.seq
        return {"seq": self.seq, "base": self.acked.seq,
                "ranks": {str(rank): whole(state, encoded) for rank, state in ranks.items()
                          if rank not in before},
                "gone": [rank for rank in before if rank not in ranks],
                "changes": changes, "beats": _by_time({rank: state.heartbeat_at
                                                       for rank, state in ranks.items()}),
                "progress": _by_time({rank: math.floor(at * 10) / 10
                                      for rank, at in held.items()})}

    def _held_back(self, ranks: dict[int, RankState], now: float, before: dict,
                   keys: dict) -> dict[int, float]:
        """The ranks that moved within MOVING_S and whose changed rings wait past the
        items saved up, with their last progress; those the head has held longest
        are sent first. What is saved up never passes one report's ring_items or
        the first waiting rank's rings, whichever is more."""
        progress = {rank: last_progress(state) for rank, state in ranks.items()
                    if rank in before and state.alive and state.error is None}
        behind = [rank for rank, at in progress.items() if now - at < MOVING_S
                  and any(keys[rank][1][name] is not before[rank][1][name] for name in RINGS)]
        behind.sort(key=lambda rank: self.rings_sent.get(rank, 0))
        costs = [sum(len(keys[rank][1][name]) for name in RINGS) for rank in behind]
        self.credit = min(self.credit + self.ring_items, max([self.ring_items] + costs[:1]))
        sent = 0
        while sent < len(behind) and costs[sent] <= self.credit:
            self.credit -= costs[sent]
            sent += 1
        return {rank: progress[rank] for rank in behind[sent:]}

    def applied(self, seq: object) -> None:
        """The head's answer: the seq it applied, or anything else for a whole report next."""
        sent, self.pending = self.pending, None
        self.acked = sent if sent is not None and seq == sent.seq else None

    def forget(self) -> None:
        """The link is gone: the next report, on a new one, is whole."""
        self.acked = self.pending = None


def _changes(state: RankState, old: tuple[dict, dict], new: tuple[dict, dict],
             encoded: dict[int, str]) -> dict:
    change = {}
    values = {name: _wire(name, getattr(state, name), encoded)
              for name in VALUES if old[0][name] != new[0][name]}
    if values:
        change["set"] = values
    lists = {}
    for name in LISTS:
        moved = _list_change(old[1][name], new[1][name])
        if moved is not None:
            drop, keep = moved
            lists[name] = [len(old[1][name]), drop, keep,
                           [as_row(item) for item in getattr(state, name)[keep:]]]
    if lists:
        change["lists"] = lists
    return change


def _by_time(times: dict[int, float]) -> list:
    """Ranks' times (heartbeats, progress), the ranks that share one as ranges."""
    by_time: dict[float, list[int]] = {}
    for rank, at in times.items():
        by_time.setdefault(at, []).append(rank)
    return [[at, rank_ranges(sorted(members))] for at, members in by_time.items()]


# -- the head ------------------------------------------------------------------

@dataclass(frozen=True)
class Known:
    """What the head holds of one node: the report it last applied, decoded and
    checked (`states`), and as it crossed (`wire`, for the node's file)."""
    seq: int
    states: dict[int, RankState]
    wire: dict[str, dict]

    @classmethod
    def read(cls, body: dict, known: Known | None, groups: GroupReader,
             rows_checked: bool = False) -> Known:
        """The node's state after this report; ValueError (ask for a whole report)
        for a delta on a state the head lacks, or anything malformed.
        `rows_checked`: a worker of the head passed the body through
        `checked_rows`, so its list items are built without a second check."""
        seq, base = body.get("seq"), body.get("base")
        if type(seq) is not int or not (base is None or type(base) is int):
            raise ValueError("a report without its sequence numbers")
        items = _built if rows_checked else _items
        if base is None:
            return cls(seq, *_decode_ranks(_object(body.get("ranks"), "ranks"), {}, {}, groups,
                                           items))
        if known is None or base != known.seq:
            raise ValueError(f"a delta on report {base}, which the head does not hold")
        return known._apply(seq, body, groups, items)

    def _apply(self, seq: int, body: dict, groups: GroupReader, items) -> Known:
        states, wire = dict(self.states), dict(self.wire)
        for rank in _list(body.get("gone", []), "gone"):
            if type(rank) is not int or rank not in states:
                raise ValueError(f"gone: {str(rank)[:20]} is no rank of this node")
            del states[rank], wire[str(rank)]
        _decode_ranks(_object(body.get("ranks", {}), "ranks"), states, wire, groups, items)
        copied: set[int] = set()
        for name, change in _object(body.get("changes", {}), "changes").items():
            rank = _rank(name, states)
            _copy(rank, states, wire, copied)
            _change(states[rank], wire[str(rank)], _object(change, f"changes[{rank}]"), groups,
                    items)
        for field, key in ((BEAT, "beats"), (PROGRESS, "progress")):
            for at, ranks in _times(body.get(key, []), key):
                for rank in ranks:
                    _copy(_rank(rank, states), states, wire, copied)
                    setattr(states[rank], field, at)
                    wire[str(rank)][field] = at
        return Known(seq, states, wire)


def _times(pairs: object, key: str) -> list[tuple[float, list[int]]]:
    """[[time, ranks], ...] checked: each time with the ranks it is for."""
    times = []
    for pair in _list(pairs, key):
        if not isinstance(pair, list) or len(pair) != 2 or not isinstance(pair[1], str):
            raise ValueError(f"{key}: not [time, ranks]")
        times.append((CHECKS[BEAT](pair[0]), parse_ranks(pair[1])))
    return times


def _decode_ranks(raw: dict, states: dict, wire: dict, groups: GroupReader,
                  items) -> tuple[dict, dict]:
    """Whole rank states into `states` and `wire`, every field checked (the
    list fields' items by `items`: `_built` where a worker checked them)."""
    for name, body in raw.items():
        rank = _rank(name)
        body = _object(body, f"rank {rank}")
        identity = _object(body.get("identity"), f"rank {rank}: identity")
        try:
            state = checked(RankState, dict(body, identity=dict(identity, groups={}),
                                            **{name: [] for name in LISTS if name in body}))
            for name in LISTS:
                if name in body:
                    setattr(state, name, items(name, body[name]))
        except ValueError as error:
            raise ValueError(f"rank {rank}: {error}") from None
        state.identity.groups = groups.read(identity.get("groups", {}))
        states[rank], wire[str(rank)] = state, body
    return states, wire


def _change(state: RankState, wire: dict, change: dict, groups: GroupReader, items) -> None:
    """One rank's changes, on the copies of its state and its wire form."""
    for name, value in _object(change.get("set", {}), "set").items():
        if name not in VALUES:
            raise ValueError(f"set: {str(name)[:40]!r} is no field a delta sets")
        setattr(state, name, _identity(value, groups) if name == "identity"
                else _checked(name, value))
        wire[name] = value
    for name, moved in _object(change.get("lists", {}), "lists").items():
        if name not in LISTS:
            raise ValueError(f"lists: {str(name)[:40]!r} is no list a delta moves")
        if not isinstance(moved, list) or len(moved) != 4:
            raise ValueError(f"lists[{name}]: not [had, drop, keep, added]")
        had, drop, keep, added = moved
        old = getattr(state, name)
        if not all(type(n) is int and n >= 0 for n in (had, drop, keep)) \
                or had != len(old) or drop + keep > had:
            raise ValueError(f"lists[{name}]: {had, drop, keep} does not fit the "
                             f"{len(old)} the head holds")
        setattr(state, name, old[drop:drop + keep] + items(name, added))
        wire[name] = wire[name][drop:drop + keep] + added
        if name in RINGS:             # the rings are the agent's now: no progress besides
            state.progress_at = wire[PROGRESS] = None


def _items(name: str, items: object) -> list:
    """A list field's items, checked: each a row (its fields' values in order), or
    an object of its fields as node files of schema 1 hold them."""
    if not isinstance(items, list):
        raise ValueError(f"RankState.{name}: not a list")
    row, whole = ROW_CHECKS[name], ITEM_CHECKS[name]
    try:
        return [row(item) if type(item) is list else whole(item) for item in items]
    except ValueError as error:
        raise ValueError(f"RankState.{name}: {error}") from None


def _built(name: str, rows: list) -> list:
    """A list field's items from the rows a worker checked (`checked_rows`)."""
    return built_list(ITEMS[name], rows)


def checked_rows(body: dict) -> dict:
    """The report with each list item checked where it lies and left as a row of
    its checked values (a schema 1 object becomes a row too): what a head's
    worker does, so that the head builds the items without checking them again
    (`Known.read(..., rows_checked=True)`). Everything else is the head's to
    check; a list where a report holds none is left as it is, and refused there."""
    ranks = body.get("ranks")
    for state in ranks.values() if isinstance(ranks, dict) else ():
        for name in LISTS:
            if isinstance(state, dict) and name in state:
                state[name] = _checked_rows(name, state[name])
    changes = body.get("changes")
    for change in changes.values() if isinstance(changes, dict) else ():
        lists = change.get("lists") if isinstance(change, dict) else None
        for name, moved in lists.items() if isinstance(lists, dict) else ():
            if name in LISTS and isinstance(moved, list) and len(moved) == 4:
                moved[3] = _checked_rows(name, moved[3])
    return body


def _checked_rows(name: str, items: object) -> list:
    return [as_row(item) for item in _items(name, items)]


def _identity(value: object, groups: GroupReader) -> Identity:
    body = _object(value, "identity")
    identity = _checked("identity", dict(body, groups={}))
    identity.groups = groups.read(body.get("groups", {}))
    return identity


def _checked(name: str, value: object):
    try:
        return CHECKS[name](value)
    except ValueError as error:
        raise ValueError(f"RankState.{name}: {error}") from None


def _copy(rank: int, states: dict, wire: dict, copied: set[int]) -> None:
    """The rank's state and wire form, copied once per delta before they change:
    the ones a snapshot may hold stay as they were."""
    if rank in copied:
        return
    copied.add(rank)
    state = object.__new__(RankState)
    state.__dict__.update(states[rank].__dict__)
    states[rank], wire[str(rank)] = state, dict(wire[str(rank)])


def _rank(name: object, states: dict | None = None) -> int:
    """A rank named by a report (a key, so text); in `states` where given."""
    if isinstance(name, str) and name.isascii() and name.isdigit() and len(name) <= 9:
        rank = int(name)
    elif type(name) is int and name >= 0:
        rank = name
    else:
        raise ValueError(f"{str(name)[:20]!r} is no rank")
    if states is not None and rank not in states:
        raise ValueError(f"rank {rank} is not on this node")
    return rank


def _object(value: object, what: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{what}: not an object")
    return value


def _list(value: object, what: str) -> list:
    if not isinstance(value, list):
        raise ValueError(f"{what}: not a list")
    return value
