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
can run code. A file's size is checked before it is read, and every field the
reader takes is checked for its type and range (fr_entries.py). Many dumps are
read by worker processes, one per core; each sends back only the plain rows it
made, which this process loads with the same unpickler and makes into records
while the workers read on. The rank is
the number that ends the file name; with a prefix (torchfrtrace's -p), only
files named PREFIX<rank> are dumps, the rank the digits after the prefix. The snapshot is taken at the newest time
any dump records: ages come from the dumps' own clock, not the files' times.

What the conversion cannot know: there are no phases, so a culprit is named
by what the majority of a group did (the member missing from a seq that the
others wait in). send/recv are matched by their order per peer within each
dump, which is right while the dumps' rings still hold every p2p op. gloo
dumps carry an empty pg_config; a group's members are then the ranks whose
dumps have entries in it. A rank named in a pg_config but without a dump is
kept, with no records, so that its peers' waits still point at it; a rank
whose dump is there but cannot be read is listed as unreadable, as a run dir's
damaged probe file is, and never makes its waiters culprits.
"""
from __future__ import annotations

import io
import os
import re
import resource
import stat
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

from diagnose.core import progress
from diagnose.core.heap import gc_paused
from diagnose.core.layout import rank_list
from diagnose.core.snapshot import CollectiveRecord, Identity, RankState, Snapshot
from diagnose.core.workers import PlainUnpickler, cores, pool, sent
from diagnose.core.vocab import Role
from diagnose.offline.fr_entries import GLOO_UNKNOWN, BadEntry, RankEntries, rows_of
from diagnose.offline.fr_groups import config_of, group_names, place, resolve_groups
from diagnose.offline.torch_debug import is_debug_file

BAR_FROM_DUMPS = 64        # fewer take well under a second
PARALLEL_FROM = 256        # fewer dumps are read in this process: workers would cost more
FILES_PER_TASK = 32        # dumps a worker reads and sends back at a time
RANK_IN_NAME = re.compile(r"(\d+)$")
PICKLE_PROTOCOL_MARK = b"\x80"
MAX_DUMP_BYTES = 256 << 20  # torch's default ring of 2000 entries is a few MB
MAX_ENTRIES = 1 << 17       # entries read from one dump, the last ones (the default ring: 2000)
UNPICKLE_BYTES = 128 << 20  # memory unpickling a dump may take: this, plus
UNPICKLE_PER_BYTE = 32      # this many bytes per byte of the file (a dump takes about 10)


class FlightRecorderError(Exception):
    """A dump or a directory of dumps that cannot be read; the message says why."""


@dataclass
class FlightRecorderRun:
    snapshot: Snapshot
    notes: list[str]        # files skipped or read in part, and why
    group_names: dict[str, set[str]]  # torch's names of a group (pg name, desc) -> diag's labels


def load_dump(path: str) -> dict:
    """One rank's dump as a dict, or FlightRecorderError. The file's size is
    checked before it is read, and it is unpickled as it streams in."""
    name = os.path.basename(path)
    try:
        with open(path, "rb") as source:
            info = os.fstat(source.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise FlightRecorderError(f"{name}: not a regular file")
            if info.st_size > MAX_DUMP_BYTES:
                raise FlightRecorderError(f"{name}: {info.st_size / 2 ** 30:.1f} GiB, over the "
                                          f"{MAX_DUMP_BYTES >> 20} MiB a dump may have")
            if not info.st_size:
                raise FlightRecorderError(f"{name}: empty file")
            dump = _unpickle(name, source)
    except OSError as error:
        raise FlightRecorderError(f"{name}: {error.strerror}") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise FlightRecorderError(f"{name}: not a Flight Recorder dump (no 'entries' list)")
    return dump


def _unpickle(name: str, source) -> object:
    try:
        with _address_space_capped(UNPICKLE_BYTES + UNPICKLE_PER_BYTE * os.fstat(source.fileno()).st_size):
            return PlainUnpickler(source, what="a Flight Recorder dump").load()
    except EOFError:
        raise FlightRecorderError(f"{name}: truncated pickle") from None
    except MemoryError:
        raise FlightRecorderError(f"{name}: not a Flight Recorder dump (a length in it asks for "
                                  f"more memory than there is)") from None
    except Exception as error:  # noqa: BLE001 - any failure of untrusted bytes is a bad dump
        if "truncated" in str(error):
            raise FlightRecorderError(f"{name}: truncated pickle") from None
        reason = f"{type(error).__name__}: {error}"[:200]
        raise FlightRecorderError(f"{name}: not a Flight Recorder dump ({reason})") from None


@contextmanager
def _address_space_capped(budget: int):
    """While untrusted bytes are unpickled, this process may map `budget` bytes
    more than it has: a pickle whose memo index or length asks for more (22
    bytes can ask for gigabytes: LONG_BINPUT 2**30) fails with MemoryError, a
    bad dump, instead of taking the memory. Where the address space cannot be
    read (no /proc), nothing is capped."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    try:
        with open("/proc/self/statm") as statm:
            mapped = int(statm.read().split()[0]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        mapped = None
    limit = None if mapped is None else mapped + budget
    if limit is None or (soft != resource.RLIM_INFINITY and soft <= limit) or (
            hard != resource.RLIM_INFINITY and hard < limit):
        yield
        return
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def looks_like_fr_dir(path: str) -> bool:
    """True if the directory holds a file that starts like a pickle (and is not
    one of torch.distributed.debug's text dumps)."""
    for name in _files(path):
        if is_debug_file(name):
            continue
        try:
            with open(os.path.join(path, name), "rb") as source:
                if source.read(1) == PICKLE_PROTOCOL_MARK:
                    return True
        except OSError:
            continue
    return False


def read_fr_dir(path: str, prefix: str | None = None) -> FlightRecorderRun:
    """Every readable dump in `path` as one Snapshot; unreadable ones become notes.
    The snapshot is taken at the newest time any dump records, so that ages
    come from the dumps' own clock wherever the files were copied to."""
    notes: list[str] = []
    dumps: dict[int, _Dump] = {}
    unreadable: dict[int, str] = {}      # rank -> why its dump is skipped
    with gc_paused():
        files = _one_per_rank(_dump_files(path, prefix, notes), notes)
        for (_, rank), read in zip(files, _read_all(path, files)):
            if isinstance(read, str):
                notes.append(f"{read}, skipped")
                unreadable[rank] = read
            else:
                config, pgs, rows, newest, gloo, read_notes = read
                dumps[rank] = _Dump(config, pgs, [CollectiveRecord(*row) for row in rows],
                                    newest, gloo)
                notes.extend(read_notes)
        if not dumps:
            reason = "; ".join(notes) if notes else "the directory is empty"
            raise FlightRecorderError(f"{path}: no readable Flight Recorder dump ({reason})")
        groups = resolve_groups(dumps, set(unreadable))
        records = {rank: place(dump.records, groups[rank])
                   for rank, dump in sorted(dumps.items())}
        members = {group.label: group.members for by_name in groups.values()
                   for group in by_name.values()}
        _settle_gloo_states(records, members, set(unreadable),
                            {rank for rank, dump in dumps.items() if dump.gloo})
    taken_at = max([dump.newest for dump in dumps.values() if dump.newest is not None],
                   default=0.0)
    own = _groups_of_each_rank(members)
    in_groups = set(own)
    highest = max(in_groups, default=-1)
    ranks = {rank: _rank_state(rank, records[rank], max(highest, rank) + 1, own.get(rank, {}),
                               taken_at)
             for rank in records}
    missing = sorted(in_groups - set(ranks) - set(unreadable))
    if missing:
        notes.append(f"{rank_list(missing)}: in a process group but no dump; kept without records")
    for rank in missing:
        ranks[rank] = _rank_state(rank, [], highest + 1, own[rank], taken_at)
    snapshot = Snapshot(taken_at=taken_at, run_dir=path, ranks=dict(sorted(ranks.items())),
                        unreadable=unreadable)
    return FlightRecorderRun(snapshot, notes, group_names(dumps, groups))


def _one_per_rank(files: list[tuple[str, int]], notes: list[str]) -> list[tuple[str, int]]:
    """The first file of each rank; a second one is noted and skipped, unread."""
    first: dict[int, str] = {}
    for name, rank in files:
        if rank in first:
            notes.append(f"{name}: a second dump of rank {rank}, skipped")
        else:
            first[rank] = name
    return [(name, rank) for name, rank in files if first[rank] == name]


def _read_all(path: str, files: list[tuple[str, int]]) -> Iterator[tuple | str]:
    """Each file's dump as _read_one gives it, in order. Many dumps are read by
    worker processes, FILES_PER_TASK at a time; what a worker sends back is
    plain data that it made itself (never an object of a dump), and it is
    loaded by the same unpickler that refuses every global."""
    names = [name for name, _ in files]
    tasks = [(path, names[start:start + FILES_PER_TASK])
             for start in range(0, len(names), FILES_PER_TASK)]
    workers = min(cores(), len(tasks)) if len(names) >= PARALLEL_FROM else 1
    with pool(workers) as readers:
        done = readers.imap(_read_task, tasks) if readers else map(_read_task, tasks)
        with _bar(len(names)) as advance:
            for (_, task_names), data in zip(tasks, done):
                read = PlainUnpickler(io.BytesIO(data)).load()
                advance(len(task_names), task_names[-1])
                yield from read


def _bar(count: int):
    if count < BAR_FROM_DUMPS:
        return nullcontext(progress.quiet)
    return progress.bar(f"reading {count} Flight Recorder dumps", count, "dumps", summary=False)


def _read_task(task: tuple[str, list[str]]) -> bytes:
    """In a worker: _read_one of each file of the task, pickled."""
    path, names = task
    return sent([_read_one(path, name) for name in names])


def _read_one(path: str, name: str) -> tuple | str:
    """One dump as the fields of a _Dump and its notes, all plain data; or why
    it cannot be read."""
    notes: list[str] = []
    try:
        config, entries = _digest(name, load_dump(os.path.join(path, name)), notes)
    except FlightRecorderError as error:
        return str(error)
    return config, entries.pgs, entries.rows, entries.newest, entries.gloo, notes


def _dump_files(path: str, prefix: str | None, notes: list[str]) -> list[tuple[str, int]]:
    """(file name, rank) of every dump: the number that ends the name, or with a
    prefix the digits after it in names that have it."""
    found = []
    for name in _files(path):
        if is_debug_file(name):
            continue                     # torch.distributed.debug's text, read by torch_debug
        if prefix is None:
            match = RANK_IN_NAME.search(name)
            digits = match.group(1) if match else ""
        else:
            at = name.find(prefix)
            digits = name[at + len(prefix):] if at >= 0 else ""
            if not digits.isdigit():
                continue                 # not PREFIX<rank>: no dump of this prefix
        if not digits.isdigit() or len(digits) > 9:
            notes.append(f"{name}: no rank number at the end of the name, skipped")
            continue
        found.append((name, int(digits)))
    if prefix is not None and not found and not notes:
        raise FlightRecorderError(f"{path}: no file named {prefix}<rank> (--prefix {prefix})")
    return found


def _files(path: str) -> list[str]:
    try:
        names = sorted(os.listdir(path))
    except OSError as error:
        raise FlightRecorderError(f"{path}: {error.strerror}") from None
    return [name for name in names if _regular(os.path.join(path, name))]


def _regular(path: str) -> bool:
    """A regular file: a FIFO, a device or a directory among the dumps is skipped
    unopened (opening a FIFO blocks until someone writes to it)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


@dataclass
class _Dump:
    """One rank's dump as read_fr_dir keeps it: its groups, and its entries
    already made records (the entries' dicts, most of a dump, are dropped),
    each made as its row came in, while the workers read on: a record's group
    is its pg name and its peer group-local until place settles them."""
    config: dict[str, tuple[str, frozenset[int]]]  # pg name -> (desc, ranks) from pg_config
    pgs: dict[str, str]         # pg name -> desc, from the entries, the first seen
    records: list[CollectiveRecord]
    newest: float | None        # the newest time its entries record
    gloo: bool                  # it has gloo entries, whose states are settled once all are read


def _digest(name: str, dump: dict, notes: list[str]
            ) -> tuple[dict[str, tuple[str, frozenset[int]]], RankEntries]:
    """The dump's groups (config_of) and entries, or FlightRecorderError for an
    entry that is not what torch writes. Of a ring longer than any torch keeps,
    the last MAX_ENTRIES entries."""
    count = len(dump["entries"])
    if count > MAX_ENTRIES:
        notes.append(f"{name}: {count} entries, the last {MAX_ENTRIES} read")
    try:
        entries = rows_of(dump["entries"][-MAX_ENTRIES:])
    except BadEntry as error:
        raise FlightRecorderError(f"{name}: {error}") from None
    return config_of(dump.get("pg_config"), name, notes), entries


def _settle_gloo_states(records: dict[int, list[CollectiveRecord]],
                        members: dict[str, list[int]], unreadable: set[int],
                        gloo_ranks: set[int]) -> None:
    """gloo leaves every entry 'scheduled' (and 'retired' says little: a timed-out
    wait is retired too). Its calls block, so an entry the rank made another call
    after has completed; its last entry completed if every member of the group
    whose dump could be read reached that seq, else the rank is still waiting
    in it."""
    last_calls = {(rank_records[-1].group, rank_records[-1].seq)
                  for rank_records in records.values()
                  if rank_records and rank_records[-1].state == GLOO_UNKNOWN}
    reached: dict[tuple[str, int], dict[int, float]] = defaultdict(dict)
    for rank, rank_records in records.items() if last_calls else ():  # NCCL's: no gloo states
        for record in rank_records:
            if record.peer is None and (record.group, record.seq) in last_calls:
                reached[(record.group, record.seq)][rank] = record.t_enqueue
    for rank in gloo_ranks:
        rank_records = records[rank]
        for record, after in zip(rank_records, rank_records[1:] + [None]):
            if record.state != GLOO_UNKNOWN:
                continue
            if after is not None:
                record.state, record.t_complete = "completed", after.t_enqueue
                continue
            arrivals = reached.get((record.group, record.seq), {})
            if record.peer is None and set(members.get(record.group, [])) - unreadable \
                    <= set(arrivals):
                record.state, record.t_complete = "completed", max(arrivals.values())
            else:
                record.state = "enqueued"


def _groups_of_each_rank(members: dict[str, list[int]]) -> dict[int, dict[str, list[int]]]:
    """rank -> the groups it is a member of (label -> members; the lists shared), so
    that a rank's identity holds its own groups, not every group of the job."""
    own: dict[int, dict[str, list[int]]] = defaultdict(dict)
    for label, ranks in members.items():
        for rank in ranks:
            own[rank][label] = ranks
    return own


def _rank_state(rank: int, records: list[CollectiveRecord], world_size: int,
                groups: dict[str, list[int]], taken_at: float) -> RankState:
    identity = Identity(role=Role.PROCESS, rank=rank, world_size=world_size, tp_rank=None,
                        tp_size=None, pp_rank=None, pp_size=None, host="", pid=0, device="",
                        groups=groups)
    pending = [record for record in records if record.state != "completed"]
    return RankState(
        identity=identity, started_at=min((r.t_enqueue for r in records), default=taken_at),
        heartbeat_at=taken_at, alive=True, open_phases=[],
        frame=pending[0].site if pending else "", phases=[], collectives=records)
