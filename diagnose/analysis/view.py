"""The snapshot, indexed for the questions the analysis asks: who joined which
collective, where each rank is blocked, which processes died."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from diagnose.core.layout import tp_group_name
from diagnose.core.snapshot import CollectiveRecord, RankState, Snapshot
from diagnose.core.vocab import P2P_OPS, Phase

DRIVER = "driver"                      # the driver's node in the wait-for graph
_P2P_NAMES = frozenset(map(str, P2P_OPS))

Node = int | str                       # a worker rank, or DRIVER


@dataclass
class Death:
    node: Node
    at: float                   # last sign of life
    exitcode: int | None        # negative: killed by signal -exitcode


class View:
    """The snapshot, indexed for the questions the analysis asks."""

    def __init__(self, snapshot: Snapshot):
        self.snapshot = snapshot
        self.now = snapshot.taken_at
        self.ranks = snapshot.ranks
        self.driver = snapshot.driver
        self.deaths = find_deaths(snapshot)
        # ranks whose state cannot be read: their peers' waits still point at them
        self.unreadable = {rank: why for rank, why in snapshot.unreadable.items()
                           if rank not in self.ranks}
        # (group, seq) -> {rank: its last record there} for group collectives: whether
        # the rank is done with the call (a coalesced group's calls share a seq)
        self.joined: dict[tuple[str, int], dict[int, CollectiveRecord]] = {}
        # (group, seq, part) -> {rank: record}: each call of a coalesced group on its own
        self.calls: dict[tuple[str, int, int], dict[int, CollectiveRecord]] = {}
        # (group, rank) or (group, op, rank, peer) -> the highest seq seen
        self.highest_seq: dict[tuple, int] = {}
        # (group, op, rank, peer, seq) -> record, for send/recv
        self.p2p: dict[tuple, CollectiveRecord] = {}
        # rank -> the earliest record it has not completed: where it is blocked
        self.pending: dict[int, CollectiveRecord] = {}
        # (group, seq, part) where a member's call differs from the first one
        # indexed there: the only places a mismatch can be
        self.disagreeing: set[tuple[str, int, int]] = set()
        self._blockers: dict[tuple[str, int], set[int]] = {}
        self._memo: dict[object, object] = {}
        for rank, state in self.ranks.items():
            self._index(rank, state.collectives, state.progress_at is not None)
        self.groups = member_groups(snapshot, self.highest_seq)
        # the last time any rank was seen compiling: a peer's compile is no stall of
        # those that wait on it, whatever a sample between two compiles reads
        self.compiled_at = max((state.activity.compiled_at for state in self.ranks.values()
                                if state.activity is not None
                                and state.activity.compiled_at is not None
                                and state.activity.pid == state.identity.pid), default=None)

    def _index(self, rank: int, records: list[CollectiveRecord], held: bool) -> None:
        """This loop meets every record of the snapshot, so it keeps to local
        names and one pass: at 1024 ranks x 2000 records that is most of the
        analysis's time. A rank whose rings its agent `held` back waits in no
        call the view knows of: it has moved on since its last records."""
        joined, calls, highest_seq, p2p = self.joined, self.calls, self.highest_seq, self.p2p
        disagreeing = self.disagreeing
        waiting = None
        top: dict[str, int] = {}            # group -> the rank's highest collective seq in it
        for record in records:
            group, seq, op = record.group, record.seq, record.op
            if op in _P2P_NAMES:
                key = (group, op, rank, record.peer)
                p2p[(*key, seq)] = record
                if highest_seq.get(key, -1) < seq:
                    highest_seq[key] = seq
            else:
                if top.get(group, -1) < seq:
                    top[group] = seq
                members = joined.get((group, seq))
                if members is None:
                    joined[(group, seq)] = {rank: record}
                else:
                    members[rank] = record
                part = record.part
                if part is not None:
                    members = calls.get((group, seq, part))
                    if members is None:
                        calls[(group, seq, part)] = {rank: record}
                    else:
                        first = next(iter(members.values()))
                        if (op != first.op or record.shapes != first.shapes
                                or record.dtype != first.dtype
                                or record.out_shapes != first.out_shapes
                                or record.out_dtype != first.out_dtype):
                            disagreeing.add((group, seq, part))
                        members[rank] = record
            if unfinished(record) and (waiting is None or record.t_enqueue < waiting.t_enqueue):
                waiting = record
        for group, seq in top.items():       # each rank is indexed once
            highest_seq[(group, rank)] = seq
        if waiting is not None and not held:
            self.pending[rank] = waiting

    def memo(self, key, make):
        """make(), computed once per view: what a question about one rank needs
        from every rank (so that asking it of each rank stays linear)."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    def member_set(self, group: str) -> set[int]:
        return self.memo(("members", group), lambda: set(self.groups.get(group, ())))

    def state(self, node: Node) -> RankState:
        return self.driver if node == DRIVER else self.ranks[node]

    def has_joined(self, rank: int, group: str, seq: int) -> bool:
        return self.highest_seq.get((group, rank), -1) >= seq

    def blockers(self, group: str, seq: int) -> set[int]:
        """Members of `group` that keep its collective `seq` from finishing: not
        joined yet, or joined and still inside. Every member waiting there
        waits on these (less itself), so the set is made once per collective."""
        key = (group, seq)
        found = self._blockers.get(key)
        if found is None:
            joined = self.joined.get(key, {})
            found = self._blockers[key] = {
                member for member in self.groups.get(group, [])
                if (member in self.ranks or member in self.unreadable)
                and (not self.has_joined(member, group, seq)
                     or (member in joined and unfinished(joined[member])))}
        return found

    def output_rank(self) -> int | None:
        """The rank that returns the sampled tokens: last PP stage, TP rank 0 (whose
        state may be unreadable: the layout says which it is)."""
        for state in self.ranks.values():
            ident = state.identity
            if ident.tp_size and ident.pp_size:
                output = (ident.pp_size - 1) * ident.tp_size
                if output in self.ranks or output in self.unreadable:
                    return output
        return max(self.ranks) if self.ranks else None


def member_groups(snapshot: Snapshot, highest_seq: dict[tuple, int]) -> dict[str, list[int]]:
    """Group name -> members: from the identities, else from the TP x PP layout,
    else every rank that has a record in the group (a (group, rank) key of
    View.highest_seq)."""
    groups: dict[str, set[int]] = defaultdict(set)
    merged = set()          # (name, id of the list): ranks of a job share their groups' lists
    for state in snapshot.ranks.values():
        for name, members in state.identity.groups.items():
            if (name, id(members)) not in merged:
                merged.add((name, id(members)))
                groups[name].update(members)
    for rank, state in snapshot.ranks.items():
        ident = state.identity
        if ident.pp_rank is not None and tp_group_name(ident.pp_rank) not in ident.groups:
            groups[tp_group_name(ident.pp_rank)].add(rank)
    for key in highest_seq:
        if len(key) == 2:
            group, rank = key
            if group not in snapshot.ranks[rank].identity.groups:
                groups[group].add(rank)
    return {name: sorted(members) for name, members in groups.items()}


def unfinished(record: CollectiveRecord) -> bool:
    """Not returned on the host, or (traced on the GPU) not finished on the device."""
    return record.state != "completed" or (record.device and record.t_device_done is None)


def gpu_behind(record: CollectiveRecord) -> bool:
    """The host made the call and moved on; the GPU has not reached it yet."""
    return record.device and record.state == "completed" and record.t_device_start is None


def find_deaths(snapshot: Snapshot) -> dict[Node, Death]:
    """Dead processes, each dated by its last sign of life (a heartbeat, a phase,
    its own exception, which may come after the last heartbeat): the driver notices a
    worker's exit only when it next looks, and notes only the first it finds.
    The driver's own exit code is the wrapped command's. When the command
    ended with 0, a process that is gone simply finished, unless the driver
    saw it fail (a job that shut itself down after losing a worker). A driver whose
    interpreter ended normally, or that had begun to shut the job down, is
    judged by the command's exit code, once known: until then it may have ended
    with 0 (before a shell around it, while the kernel tears its process down,
    or killed by its own parent as part of the shutdown, as vLLM's API server
    kills its engine core)."""
    exits = {}
    if snapshot.driver is not None:
        exits = {exit.rank: exit for exit in snapshot.driver.worker_exits}
    if snapshot.command_exit == 0:
        return {rank: Death(rank, min(exit.at, snapshot.ranks[rank].last_sign_of_life),
                            exit.exitcode)
                for rank, exit in exits.items()
                if exit.exitcode not in (0, None) and rank in snapshot.ranks}
    stopping = driver_shutting_down(snapshot)
    deaths: dict[Node, Death] = {}
    for rank, state in snapshot.ranks.items():
        if rank in exits:
            exit = exits[rank]
            deaths[rank] = Death(rank, min(exit.at, state.last_sign_of_life), exit.exitcode)
        elif not state.alive and not stopping and not state.ended_normally:
            deaths[rank] = Death(rank, state.last_sign_of_life, None)
    driver = snapshot.driver
    if driver is not None and not driver.alive and (
            snapshot.command_exit is not None or not (driver.ended_normally or stopping)):
        deaths[DRIVER] = Death(DRIVER, driver.heartbeat_at, snapshot.command_exit)
    return deaths


def shutdown_starts(snapshot: Snapshot) -> list[float]:
    """When the driver began to stop its workers (a list: empty, or one time)."""
    driver = snapshot.driver
    if driver is None:
        return []
    just_before = 1e-3
    return [event.start - just_before for event in driver.open_phases + driver.phases
            if event.name == Phase.SHUTDOWN][:1]


def driver_left(view: View) -> list[float]:
    """When the driver's process ended, where that is no death (yet): the job is
    ending, and a rank left inside its step after that waits on the end, not on
    a peer; the command's exit code says later whether the driver died (a list:
    empty, or one time)."""
    driver = view.driver
    if driver is None or driver.alive or DRIVER in view.deaths:
        return []
    return [driver.last_sign_of_life]


def driver_shutting_down(snapshot: Snapshot) -> bool:
    """The driver has begun to stop its workers: a worker that is gone now went
    because it was told to, unless the driver recorded its exit as a failure."""
    return bool(shutdown_starts(snapshot))
