"""PyTorch Flight Recorder dumps -> a Snapshot, so the same analyze() reads them.

A dump is one pickle per rank, as torch writes it on a watchdog timeout
(TORCH_NCCL_DEBUG_INFO_TEMP_FILE, default /tmp/nccl_trace_rank_<R>) or as
`torch._C._distributed_c10d._dump_fr_trace()` returns it (gloo records too). It
holds 'version', 'pg_config' {pg name: {'name', 'desc', 'ranks': "[0, 1]"}},
'pg_status' and 'entries', each entry one collective or send/recv with
'process_group' (name, desc), 'collective_seq_id', 'profiling_name'
('nccl:all_reduce', 'nccl:send 0->1' with group-local ranks), 'input_sizes',
'input_dtypes', 'state' ('scheduled', 'started', 'completed'), 'retired',
'time_created_ns', 'time_discovered_completed_ns' and 'frames'.

The files are unpickled by an unpickler that refuses every global: a dump is
built from dicts, lists, tuples, strings and numbers only, so nothing in it
can run code. The rank is the number that ends the file name.

What the conversion cannot know: there are no phases, so a culprit is named
by what the majority of a group did (the member missing from a seq that the
others wait in). send/recv are matched by their order per peer within each
dump, which is right while the dumps' rings still hold every p2p op. gloo
dumps carry an empty pg_config; a group's members are then the ranks whose
dumps have entries in it. A rank named in a pg_config but without a readable
dump is kept, with no records, so that its peers' waits still point at it.
"""
from __future__ import annotations

import ast
import functools
import gc
import io
import os
import pickle
import re
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import dataclass

from diagnose.core.snapshot import CollectiveRecord, Identity, RankState, Snapshot
from diagnose.core.vocab import Role

RANK_IN_NAME = re.compile(r"(\d+)$")
PICKLE_PROTOCOL_MARK = b"\x80"
REQUIRED_FIELDS = ("process_group", "profiling_name", "collective_seq_id", "state",
                   "time_created_ns")
TORCH_FRAMES = f"{os.sep}torch{os.sep}"
GLOO_UNKNOWN = "gloo"       # a gloo entry's state until _settle_gloo_states decides it


class FlightRecorderError(Exception):
    """A dump or a directory of dumps that cannot be read; the message says why."""


@dataclass
class FlightRecorderRun:
    snapshot: Snapshot
    notes: list[str]        # files skipped or read in part, and why


class _DataOnlyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: a Flight Recorder dump "
                                     f"holds plain data only")


def load_dump(path: str) -> dict:
    """One rank's dump as a dict, or FlightRecorderError."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as source:
            data = source.read()
    except OSError as error:
        raise FlightRecorderError(f"{name}: {error.strerror}") from None
    if not data:
        raise FlightRecorderError(f"{name}: empty file")
    try:
        dump = _DataOnlyUnpickler(io.BytesIO(data)).load()
    except EOFError:
        raise FlightRecorderError(f"{name}: truncated pickle") from None
    except (pickle.UnpicklingError, ValueError, TypeError, IndexError, KeyError) as error:
        if "truncated" in str(error):
            raise FlightRecorderError(f"{name}: truncated pickle") from None
        raise FlightRecorderError(f"{name}: not a Flight Recorder dump ({error})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise FlightRecorderError(f"{name}: not a Flight Recorder dump (no 'entries' list)")
    return dump


def looks_like_fr_dir(path: str) -> bool:
    """True if the directory holds a file that starts like a pickle."""
    for name in _files(path):
        try:
            with open(os.path.join(path, name), "rb") as source:
                if source.read(1) == PICKLE_PROTOCOL_MARK:
                    return True
        except OSError:
            continue
    return False


def read_fr_dir(path: str) -> FlightRecorderRun:
    """Every readable dump in `path` as one Snapshot; unreadable ones become notes."""
    notes: list[str] = []
    dumps: dict[int, _Dump] = {}
    mtimes: list[float] = []
    with _gc_paused():
        for name in _files(path):
            match = RANK_IN_NAME.search(name)
            if match is None:
                notes.append(f"{name}: no rank number at the end of the name, skipped")
                continue
            rank = int(match.group(1))
            try:
                dump = load_dump(os.path.join(path, name))
            except FlightRecorderError as error:
                notes.append(f"{error}, skipped")
                continue
            if rank in dumps:
                notes.append(f"{name}: a second dump of rank {rank}, skipped")
                continue
            dumps[rank] = _digest(dump)
            mtimes.append(os.path.getmtime(os.path.join(path, name)))
        if not dumps:
            reason = "; ".join(notes) if notes else "the directory is empty"
            raise FlightRecorderError(f"{path}: no readable Flight Recorder dump ({reason})")
        groups = _groups(dumps)
        records: dict[int, list[CollectiveRecord]] = {}
        for rank, dump in sorted(dumps.items()):
            records[rank], misplaced = _place(dump.records, groups)
            skipped = dump.skipped + misplaced
            if skipped:
                notes.append(f"rank {rank}: {skipped} entries without the expected fields, skipped")
        _settle_gloo_states(records, groups)
    taken_at = max(mtimes)
    in_groups = _all_members(groups)
    highest = max(in_groups, default=-1)
    members = {group.label: group.members for group in groups.values()}
    ranks = {rank: _rank_state(rank, records[rank], max(highest, rank) + 1, members, taken_at)
             for rank in records}
    for rank in sorted(in_groups - set(ranks)):
        notes.append(f"rank {rank}: in a process group but no readable dump; kept without records")
        ranks[rank] = _rank_state(rank, [], highest + 1, members, taken_at)
    snapshot = Snapshot(taken_at=taken_at, run_dir=path, ranks=dict(sorted(ranks.items())))
    return FlightRecorderRun(snapshot, notes)


@contextmanager
def _gc_paused():
    """Dumps are millions of small objects without reference cycles. While they
    are read, the cyclic GC would only scan the growing heap again and again
    (two thirds of the time of reading 128 dumps of 2000 entries); once read,
    it would walk the records three times more as they age through its
    generations (3.6 s after reading 1024 dumps). So it is paused, and what
    lives then is frozen out of its reach (gc.freeze: still freed when no
    longer referenced)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def _files(path: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError as error:
        raise FlightRecorderError(f"{path}: {error.strerror}") from None
    return [name for name in names if os.path.isfile(os.path.join(path, name))]


@dataclass
class _Dump:
    """One rank's dump as read_fr_dir keeps it: its groups, and its entries
    already made records (the entries' dicts, most of a dump, are dropped).
    Until _place, a record's group is its pg name and its peer group-local."""
    config: object              # pg_config, as the dump has it
    pgs: dict[str, str]         # pg name -> desc, from the entries, the first seen
    records: list[CollectiveRecord]
    skipped: int                # entries without the expected fields


def _digest(dump: dict) -> _Dump:
    pgs: dict[str, str] = {}
    for entry in dump["entries"]:
        pg = entry.get("process_group") if isinstance(entry, dict) else None
        if isinstance(pg, (tuple, list)) and len(pg) == 2:
            pgs.setdefault(str(pg[0]), str(pg[1]))
    records, skipped = _records(dump["entries"])
    return _Dump(dump.get("pg_config"), pgs, records, skipped)


@dataclass
class _Group:
    label: str              # the name records carry: the pg's description, or pg<name>
    members: list[int]      # global ranks, sorted


def _groups(dumps: dict[int, _Dump]) -> dict[str, _Group]:
    """pg name -> group, merged over every rank's pg_config and entries."""
    descs: dict[str, str] = {}
    configured: dict[str, set[int]] = defaultdict(set)   # members as pg_config lists them
    seen: dict[str, set[int]] = defaultdict(set)         # ranks with entries in the pg
    for rank, dump in dumps.items():
        config = dump.config
        for pg_name, pg in (config.items() if isinstance(config, dict) else ()):
            if isinstance(pg, dict) and pg_name:
                descs.setdefault(str(pg_name), str(pg.get("desc", "")))
                configured[str(pg_name)].update(_parse_ranks(pg.get("ranks")))
        for pg_name, desc in dump.pgs.items():
            descs.setdefault(pg_name, desc)
            seen[pg_name].add(rank)
    uses = defaultdict(int)
    for desc in descs.values():
        uses[desc] += 1
    groups = {}
    for pg_name, desc in descs.items():
        members = configured[pg_name] or seen[pg_name]
        if desc == "default_pg":
            label, members = "world", members | set(dumps)
        elif desc and desc != "undefined" and uses[desc] == 1:
            label = desc
        else:
            label = f"pg{pg_name}"
        groups[pg_name] = _Group(label, sorted(members))
    return groups


def _all_members(groups: dict[str, _Group]) -> set[int]:
    return {member for group in groups.values() for member in group.members}


def _parse_ranks(text) -> list[int]:
    return list(_parse_rank_text(text)) if isinstance(text, str) else _rank_list(text)


@functools.lru_cache(maxsize=4096)
def _parse_rank_text(text: str) -> tuple[int, ...]:
    """Every dump repeats its groups' rank lists: each text is parsed once."""
    try:
        return tuple(_rank_list(ast.literal_eval(text)))
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return ()


def _rank_list(ranks) -> list[int]:
    if isinstance(ranks, (list, tuple)) and all(isinstance(rank, int) for rank in ranks):
        return list(ranks)
    return []


def _records(entries: list) -> tuple[list[CollectiveRecord], int]:
    """The usable entries as records (see _Dump) in the order the rank made
    them, and how many were unusable."""
    usable = [entry for entry in entries
              if isinstance(entry, dict) and all(key in entry for key in REQUIRED_FIELDS)]
    skipped = len(entries) - len(usable)
    records = []
    for entry in sorted(usable, key=lambda entry: entry.get("record_id", 0)):
        try:
            records.append(_record(entry))
        except (TypeError, ValueError, IndexError):
            skipped += 1
    return records, skipped


def _place(records: list[CollectiveRecord],
           groups: dict[str, _Group]) -> tuple[list[CollectiveRecord], int]:
    """Gives each record its group's label and its peer's global rank, and
    numbers send/recv per (group, op, peer); returns the records, and how many
    named a peer their group cannot have."""
    placed, skipped = [], 0
    p2p_counts: dict[tuple, int] = defaultdict(int)
    for record in records:
        group = groups.get(record.group) or _Group(f"pg{record.group}", [])
        record.group = group.label
        if record.peer is not None:
            local, members = record.peer, group.members
            try:
                record.peer = members[local] if local < len(members) else local
            except IndexError:
                skipped += 1
                continue
            key = (record.group, record.op, record.peer)
            record.seq = p2p_counts[key]
            p2p_counts[key] += 1
        placed.append(record)
    return placed, skipped


def _record(entry: dict) -> CollectiveRecord:
    pg_name = str(entry["process_group"][0])
    backend, _, name = str(entry["profiling_name"]).partition(":")
    op, peer = _op_and_local_peer(name)
    created = int(entry["time_created_ns"]) / 1e9
    completed_ns = entry.get("time_discovered_completed_ns")
    done = entry["state"] == "completed"
    dtypes = entry.get("input_dtypes") or []
    return CollectiveRecord(
        group=pg_name, seq=int(entry["collective_seq_id"]), op=op, peer=peer,
        shapes=list(map(list, entry.get("input_sizes") or [])),
        dtype=",".join(sorted(set(map(str, dtypes)))), nbytes=0,
        site=_site(entry.get("frames") or []),
        state=GLOO_UNKNOWN if backend == "gloo" else "completed" if done else "enqueued",
        t_enqueue=created,
        t_complete=(int(completed_ns) / 1e9 if completed_ns else created) if done else None)


def _settle_gloo_states(records: dict[int, list[CollectiveRecord]], groups: dict[str, _Group]) -> None:
    """gloo leaves every entry 'scheduled' (and 'retired' says little: a timed-out
    wait is retired too). Its calls block, so an entry the rank made another call
    after has completed; its last entry completed if every member of the group
    reached that seq, else the rank is still waiting in it."""
    members = {group.label: group.members for group in groups.values()}
    last_calls = {(rank_records[-1].group, rank_records[-1].seq)
                  for rank_records in records.values()
                  if rank_records and rank_records[-1].state == GLOO_UNKNOWN}
    reached: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for rank, rank_records in records.items() if last_calls else ():  # NCCL's: no gloo states
        for record in rank_records:
            if record.peer is None and (record.group, record.seq) in last_calls:
                reached[(record.group, record.seq)][rank] = record.t_enqueue
    for rank, rank_records in records.items():
        for record, after in zip(rank_records, rank_records[1:] + [None]):
            if record.state != GLOO_UNKNOWN:
                continue
            if after is not None:
                record.state, record.t_complete = "completed", after.t_enqueue
                continue
            arrivals = reached.get((record.group, record.seq), {})
            if record.peer is None and set(members.get(record.group, [])) <= set(arrivals):
                record.state, record.t_complete = "completed", max(arrivals.values())
            else:
                record.state = "enqueued"


def _op_and_local_peer(name: str) -> tuple[str, int | None]:
    """'send 0->1' -> ('send', 1), the peer group-local; 'all_reduce' -> ('all_reduce', None)."""
    op, _, route = name.partition(" ")
    if op == "send" and "->" in route:
        return op, int(route.split("->")[1])
    if op == "recv" and "<-" in route:
        return op, int(route.split("<-")[1])
    return op, None


def _site(frames: list) -> str:
    """The first frame outside torch: where the program called the collective."""
    for frame in frames:
        if isinstance(frame, dict):
            path = str(frame.get("filename", ""))
            if TORCH_FRAMES not in path:
                return f"{_basename(path)}:{frame.get('line')} {frame.get('name')}"
    return ""


@functools.lru_cache(maxsize=4096)
def _basename(path: str) -> str:
    """The entries of a dump name the same few files over and over."""
    return os.path.basename(path)


def _rank_state(rank: int, records: list[CollectiveRecord], world_size: int,
                members: dict[str, list[int]], taken_at: float) -> RankState:
    identity = Identity(role=Role.PROCESS, rank=rank, world_size=world_size, tp_rank=None,
                        tp_size=None, pp_rank=None, pp_size=None, host="", pid=0, device="",
                        groups=members)
    pending = [record for record in records if record.state != "completed"]
    return RankState(
        identity=identity, started_at=min((r.t_enqueue for r in records), default=taken_at),
        heartbeat_at=taken_at, alive=True, open_phases=[],
        frame=pending[0].site if pending else "", phases=[], collectives=records)
