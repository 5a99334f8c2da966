"""From a snapshot of every rank to verdicts: who is stuck, and who is to blame.

One pure function, `analyze(snapshot)`: no I/O, no clock (now is
`snapshot.taken_at`). It serves the live view and the post-mortem alike.

The analysis builds a wait-for graph over the driver and the worker ranks:

  - a rank blocked in a collective of group G at seq S waits on each member of
    G that has not joined seq S, or joined it and is still inside it;
  - the n-th recv at b from a waits on the n-th send a->b, and the other way round;
  - a worker idle in `dequeue` that has read every broadcast message waits on
    the driver; the driver inside `execute_model` waits on the output rank
    (the last PP stage's TP rank 0).

Ranks at the root of the graph (a terminal strongly connected component: a
rank that waits on no one, or a cycle) are the culprits once they have made no
progress for longer than their phase's stall limit; every rank that reaches
them is a victim. Three rules come before the graph: a dead process is the
culprit of everything that follows (the first to die, if several), members
that disagree on the op of one collective are a mismatch, and a member that
went past a collective seq without joining it (or past its side of a
send/recv a peer waits in) is the culprit of that collective even where the
graph has a cycle through the driver. On a GPU the
host returns from a collective once it is enqueued: a call the device has not
finished still counts as unfinished, and a rank whose GPU has not even reached
it waits on no one but its own GPU (`gpu_stuck`). A job that
hung and was then stopped is judged as it stood just before its first death,
so the hang, not the kill, is named. In a multi-node job, a node whose agent
went silent is `node_lost`: the verdicts that blame its ranks, whose state is
stale, give way to that one.

The driver is not a rank: where it is a culprit or a victim, verdicts say so
in the summary and in evidence["culprit"] == "driver"; rank lists hold workers.
"""
from __future__ import annotations

import signal
from bisect import bisect_left, bisect_right
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, replace
from operator import attrgetter
from statistics import median

from diagnose.snapshot import (CollectiveRecord, NodeState, PhaseEvent, RankState, Snapshot,
                               STARTUP_PHASES, Verdict)
from diagnose.thresholds import StallLimits, Thresholds

DRIVER = "driver"                      # the driver's node in the wait-for graph
P2P_OPS = ("send", "recv")
MILESTONES = STARTUP_PHASES + ("execute_model",)  # the phases a worker meets once, in order
CLEAN_EXIT_PHASE = "exit"              # generic mode: a process that ended normally enters it last
DEATH_SLACK_S = 0.3                    # a few heartbeats: deaths closer than this are not ordered by time
LAST_RECORDS = 3                       # collective records put in a verdict's evidence
RECENT = 256                           # records and phases per rank the analysis reads (4 probe rings)
ENQUEUED_AT = attrgetter("t_enqueue")

Node = int | str                       # a worker rank, or DRIVER


def analyze(snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
    """Verdicts, the most likely root cause first; an empty list means healthy."""
    verdicts = _judge(recent(snapshot), thresholds or Thresholds())
    lost = [node for node in snapshot.nodes if node.lost]
    return node_lost_verdicts(lost, verdicts, snapshot.taken_at) if lost else verdicts


def _judge(snapshot: Snapshot, thresholds: Thresholds) -> list[Verdict]:
    view = View(snapshot)
    if view.deaths:
        # A job that hung and was then stopped: the hang, seen as it stood just
        # before the first death, is the cause, and the deaths came after it.
        first_death = min([death.at for death in view.deaths.values()]
                          + _shutdown_starts(snapshot))
        before = rewind(snapshot, first_death)
        hangs = hang_verdicts(View(before), StallLimits(before, thresholds))
        for verdict in hangs:
            verdict.evidence["job_ended_s_ago"] = round(view.now - first_death, 3)
        if hangs:
            return hangs
    limits = StallLimits(snapshot, thresholds)
    verdicts = dead_verdicts(view, wait_for_graph(view)) + hang_verdicts(view, limits)
    return verdicts + straggler_verdicts(view, thresholds)


def node_lost_verdicts(lost: list[NodeState], verdicts: list[Verdict],
                       now: float) -> list[Verdict]:
    """A lost node's ranks are known only as they stood when its agent went
    silent, so the verdicts that blame them give way to one naming the node."""
    lost_ranks = {rank for node in lost for rank in node.ranks}
    blamed = [verdict for verdict in verdicts if set(verdict.culprit_ranks) & lost_ranks]
    waiting = sorted({rank for verdict in blamed for rank in verdict.victim_ranks} - lost_ranks)
    kept = [verdict for verdict in verdicts if verdict not in blamed]
    return [_node_lost(node, waiting, now) for node in lost] + kept


def _node_lost(node: NodeState, waiting: list[int], now: float) -> Verdict:
    silence = ("never reported" if node.last_seen is None
               else f"last reported {now - node.last_seen:.1f}s ago")
    ranks = rank_list(node.ranks) if node.ranks else "ranks unknown"
    summary = (f"node {node.node_rank} ({node.host or 'host unknown'}, {ranks}) is lost: its "
               f"agent {silence}; what its ranks did since is unknown")
    if waiting:
        summary += f"; {rank_list(waiting)} {_verb(waiting)} on it"
    return Verdict(kind="node_lost", culprit_ranks=list(node.ranks), victim_ranks=waiting,
                   summary=summary, evidence={"node_rank": node.node_rank, "host": node.host,
                                              "last_seen": node.last_seen})


def recent(snapshot: Snapshot) -> Snapshot:
    """Each rank's last RECENT records and phases. A hang is judged from where the
    ranks are now; a longer history (2000 entries of a Flight Recorder dump) only
    costs time: at 1024 ranks, 2.9 s instead of a fraction of one."""
    if all(len(state.collectives) <= RECENT and len(state.phases) <= RECENT
           for state in snapshot.ranks.values()):
        return snapshot
    return replace(snapshot, ranks={
        rank: replace(state, collectives=state.collectives[-RECENT:],
                      phases=state.phases[-RECENT:])
        for rank, state in snapshot.ranks.items()})


def rewind(snapshot: Snapshot, when: float) -> Snapshot:
    """The snapshot as it would have been taken at `when`, everyone alive: later
    events are dropped, and what ended later is still open."""
    def state_at(state: RankState) -> RankState:
        events = {(event.name, event.start): event for event in state.phases + state.open_phases}
        phases = [PhaseEvent(event.name, event.step, event.start,
                             event.end if event.end is not None and event.end <= when else None)
                  for event in sorted(events.values(), key=lambda event: event.start)
                  if event.start <= when]
        records = [_record_at(record, when)
                   for record in state.collectives if record.t_enqueue <= when]
        return replace(state, alive=True, heartbeat_at=min(state.heartbeat_at, when),
                       phases=phases, open_phases=[event for event in phases if event.end is None],
                       collectives=records,
                       worker_exits=[exit for exit in state.worker_exits if exit.at <= when])

    driver = state_at(snapshot.driver) if snapshot.driver is not None else None
    return replace(snapshot, taken_at=when, driver=driver, command_exit=None,
                   ranks={rank: state_at(state) for rank, state in snapshot.ranks.items()})


def _record_at(record: CollectiveRecord, when: float) -> CollectiveRecord:
    if record.t_complete is None or record.t_complete > when:
        record = replace(record, state="enqueued", t_complete=None)
    if record.t_device_start is not None and record.t_device_start > when:
        record = replace(record, t_device_start=None)
    if record.t_device_done is not None and record.t_device_done > when:
        record = replace(record, t_device_done=None)
    return record


def hang_verdicts(view: View, limits: StallLimits) -> list[Verdict]:
    graph = wait_for_graph(view)
    verdicts = mismatch_verdicts(view)
    verdicts += skipped_collective_verdicts(view, graph, limits)
    verdicts += skipped_p2p_verdicts(view, graph, limits, verdicts)
    named = {rank for verdict in verdicts for rank in verdict.culprit_ranks}
    return verdicts + root_verdicts(view, graph, limits, named)


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
        self.deaths = _deaths(snapshot)
        # (group, seq) -> {rank: record} for group collectives
        self.joined: dict[tuple[str, int], dict[int, CollectiveRecord]] = {}
        # (group, rank) or (group, op, rank, peer) -> the highest seq seen
        self.highest_seq: dict[tuple, int] = {}
        # (group, op, rank, peer, seq) -> record, for send/recv
        self.p2p: dict[tuple, CollectiveRecord] = {}
        # rank -> the earliest record it has not completed: where it is blocked
        self.pending: dict[int, CollectiveRecord] = {}
        # (group, seq) where a member's call differs from the first one indexed
        # there: the only places a mismatch can be
        self.disagreeing: set[tuple[str, int]] = set()
        self._blockers: dict[tuple[str, int], set[int]] = {}
        for rank, state in self.ranks.items():
            self._index(rank, state.collectives)
        self.groups = _groups(snapshot, self.highest_seq)

    def _index(self, rank: int, records: list[CollectiveRecord]) -> None:
        """This loop meets every record of the snapshot, so it keeps to local
        names and one pass: at 1024 ranks x 2000 records that is most of the
        analysis's time."""
        joined, highest_seq, p2p = self.joined, self.highest_seq, self.p2p
        waiting = None
        for record in records:
            group, seq = record.group, record.seq
            if record.op in P2P_OPS:
                key = (group, record.op, rank, record.peer)
                p2p[key + (seq,)] = record
            else:
                key = (group, rank)
                members = joined.get((group, seq))
                if members is None:
                    joined[(group, seq)] = {rank: record}
                else:
                    first = next(iter(members.values()))
                    if (record.op != first.op or record.shapes != first.shapes
                            or record.dtype != first.dtype):
                        self.disagreeing.add((group, seq))
                    members[rank] = record
            highest = highest_seq.get(key, -1)
            highest_seq[key] = seq if seq > highest else highest
            if unfinished(record) and (waiting is None or record.t_enqueue < waiting.t_enqueue):
                waiting = record
        if waiting is not None:
            self.pending[rank] = waiting

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
                member for member in self.groups.get(group, []) if member in self.ranks
                and (not self.has_joined(member, group, seq)
                     or (member in joined and unfinished(joined[member])))}
        return found

    def output_rank(self) -> int | None:
        """The rank that returns the sampled tokens: last PP stage, TP rank 0."""
        for rank, state in self.ranks.items():
            ident = state.identity
            if ident.tp_rank == 0 and ident.pp_size is not None and ident.pp_rank == ident.pp_size - 1:
                return rank
        return max(self.ranks) if self.ranks else None


def _groups(snapshot: Snapshot, highest_seq: dict[tuple, int]) -> dict[str, list[int]]:
    """Group name -> members: from the identities, else from the TP x PP layout,
    else every rank that has a record in the group (a (group, rank) key of
    View.highest_seq)."""
    groups: dict[str, set[int]] = defaultdict(set)
    merged = None
    for state in snapshot.ranks.values():
        if state.identity.groups == merged:
            continue                    # ranks of a job mostly carry the same groups
        merged = state.identity.groups
        for name, members in merged.items():
            groups[name].update(members)
    for rank, state in snapshot.ranks.items():
        ident = state.identity
        if ident.pp_rank is not None and f"tp{ident.pp_rank}" not in state.identity.groups:
            groups[f"tp{ident.pp_rank}"].add(rank)
    for key in highest_seq:
        if len(key) == 2:
            group, rank = key
            if group not in snapshot.ranks[rank].identity.groups:
                groups[group].add(rank)
    return {name: sorted(members) for name, members in groups.items()}


def _deaths(snapshot: Snapshot) -> dict[Node, Death]:
    """Dead processes, each dated by its last heartbeat: the driver notices a
    worker's exit only when it next looks, and notes only the first it finds.
    The driver's own exit code is the wrapped command's. When the command
    ended with 0, a process that is gone simply finished."""
    if snapshot.command_exit == 0:
        return {}
    exits = {}
    if snapshot.driver is not None:
        exits = {exit.rank: exit for exit in snapshot.driver.worker_exits}
    stopping = _driver_shutting_down(snapshot)
    deaths: dict[Node, Death] = {}
    for rank, state in snapshot.ranks.items():
        if rank in exits:
            exit = exits[rank]
            deaths[rank] = Death(rank, min(exit.at, state.heartbeat_at), exit.exitcode)
        elif not state.alive and not stopping and not _exited_cleanly(state):
            deaths[rank] = Death(rank, state.heartbeat_at, None)
    driver = snapshot.driver
    if driver is not None and not driver.alive:
        deaths[DRIVER] = Death(DRIVER, driver.heartbeat_at, snapshot.command_exit)
    return deaths


def _exited_cleanly(state: RankState) -> bool:
    events = state.phases + state.open_phases
    return bool(events) and max(events, key=lambda event: event.start).name == CLEAN_EXIT_PHASE


def _shutdown_starts(snapshot: Snapshot) -> list[float]:
    """When the driver began to stop its workers (a list: empty, or one time)."""
    driver = snapshot.driver
    if driver is None:
        return []
    just_before = 1e-3
    return [event.start - just_before for event in driver.open_phases + driver.phases
            if event.name == "shutdown"][:1]


def _driver_shutting_down(snapshot: Snapshot) -> bool:
    """The driver has begun to stop its workers: a worker that is gone now went
    because it was told to, unless the driver recorded its exit as a failure."""
    return bool(_shutdown_starts(snapshot))


# Where a process is and when it last moved.

def innermost(state: RankState) -> PhaseEvent | None:
    return state.open_phases[-1] if state.open_phases else None


def last_progress(state: RankState) -> float:
    times = [state.started_at]
    for event in state.phases + state.open_phases:
        times.append(event.start if event.end is None else event.end)
    for record in state.collectives:
        times.append(record.t_enqueue if record.t_complete is None else record.t_complete)
    return max(times)


def unfinished(record: CollectiveRecord) -> bool:
    """Not returned on the host, or (traced on the GPU) not finished on the device."""
    return record.state != "completed" or (record.device and record.t_device_done is None)


def gpu_behind(record: CollectiveRecord) -> bool:
    """The host made the call and moved on; the GPU has not reached it yet."""
    return record.device and record.state == "completed" and record.t_device_start is None


def device_progress(state: RankState) -> float:
    """The last time the rank's GPU was seen to finish a traced call."""
    return max([record.t_device_done for record in state.collectives
                if record.t_device_done is not None], default=state.started_at)


def current_step(state: RankState) -> int | None:
    for event in reversed(state.open_phases):
        if event.step is not None:
            return event.step
    return last_step(state)


def last_step(state: RankState) -> int | None:
    """The last step the rank finished."""
    steps = [event.step for event in state.phases if event.name == "execute_model"
             and event.step is not None and event.end is not None]
    return max(steps) if steps else None


def position(state: RankState) -> tuple[float, int] | None:
    """How far a worker is through the step loop: (step, phases finished inside
    the step). Between steps counts as step + 0.5; None without phase data."""
    open_step = next((event for event in reversed(state.open_phases)
                      if event.name == "execute_model"), None)
    if open_step is not None and open_step.step is not None:
        done = sum(1 for event in state.phases
                   if event.end is not None and event.start >= open_step.start)
        return (open_step.step, done)
    step = last_step(state)
    if step is not None:
        return (step + 0.5, 0)
    if state.phases or state.open_phases:
        return (-1, 0)
    return None


def milestone(state: RankState) -> int:
    """Index in MILESTONES of the furthest start-up/step phase the rank entered."""
    names = {event.name for event in state.phases + state.open_phases}
    reached = [index for index, name in enumerate(MILESTONES) if name in names]
    return max(reached, default=-1)


def where(state: RankState) -> str:
    phase = innermost(state)
    closed = [event for event in state.phases if event.end is not None]
    if phase is None:
        if closed:
            return f"stuck after {max(closed, key=lambda event: event.end).name}"
        return "stuck before its first phase"
    inside = [event for event in closed if event.start >= phase.start]
    if inside:
        return f"stuck in {phase.name} after {max(inside, key=lambda event: event.end).name}"
    return f"stuck in {phase.name}"


def limit_phase(view: View, node: Node) -> str | None:
    """The phase whose stall limit applies: where the process is, or for a worker
    between phases the next phase of its start-up/step sequence."""
    state = view.state(node)
    phase = innermost(state)
    if node != DRIVER and ring_behind(view, node):
        return "execute_model"          # a message waits to be read: a step is due
    if phase is not None:
        return phase.name
    if state.identity.role == "worker" and _last_closed(state) == "dequeue":
        return None                     # it took a message and never began the work: no
                                        # engine code runs long between these phases
    if state.identity.role == "worker":
        return MILESTONES[min(milestone(state) + 1, len(MILESTONES) - 1)]
    return _last_closed(state)


def _last_closed(state: RankState) -> str | None:
    closed = [event for event in state.phases if event.end is not None]
    return max(closed, key=lambda event: event.end).name if closed else None


def ring_behind(view: View, rank: int) -> bool:
    """The worker sits in dequeue without reading messages the driver wrote and
    other workers took."""
    driver, state = view.driver, view.ranks[rank]
    phase = innermost(state)
    if driver is None or phase is None or phase.name != "dequeue":
        return False
    read = state.ring_read
    return read < driver.ring_written and any(
        other.ring_read > read for peer, other in view.ranks.items() if peer != rank)


# The wait-for graph.

def wait_for_graph(view: View) -> dict[Node, set[Node]]:
    graph: dict[Node, set[Node]] = {rank: set() for rank in view.ranks}
    driver = view.driver
    if driver is not None:
        graph[DRIVER] = set()
    for rank, state in view.ranks.items():
        if rank in view.deaths:
            continue
        record = view.pending.get(rank)
        if record is not None:
            graph[rank] |= record_waits(view, rank, record)
            if gpu_behind(record):
                continue               # it waits on its own GPU, whatever its host does next
        phase = innermost(state)
        if (driver is not None and phase is not None and phase.name == "dequeue"
                and state.ring_read >= driver.ring_written):
            graph[rank].add(DRIVER)
    if driver is not None and DRIVER not in view.deaths:
        phase = innermost(driver)
        output = view.output_rank()
        if phase is not None and phase.name == "execute_model" and output is not None:
            graph[DRIVER].add(output)
    return graph


def record_waits(view: View, rank: int, record: CollectiveRecord) -> set[Node]:
    """The ranks that `rank`, blocked in `record`, waits on."""
    if gpu_behind(record):
        return set()                   # it waits on its own GPU
    if record.op in P2P_OPS:
        peer = record.peer
        if peer not in view.ranks:
            return set()
        other_op = "recv" if record.op == "send" else "send"
        match = view.p2p.get((record.group, other_op, peer, rank, record.seq))
        matched = view.highest_seq.get((record.group, other_op, peer, rank), -1) >= record.seq
        if matched and (match is None or not unfinished(match)):
            return set()
        return {peer}
    return view.blockers(record.group, record.seq) - {rank}


def waited_by(graph: dict[Node, set[Node]]) -> dict[Node, set[Node]]:
    """Node -> the nodes with an edge to it: what reachers() walks."""
    reverse: dict[Node, set[Node]] = defaultdict(set)
    for node, outs in graph.items():
        for out in outs:
            reverse[out].add(node)
    return reverse


def reachers(reverse: dict[Node, set[Node]], targets: set[Node]) -> set[Node]:
    """Every node with a path to one of `targets` (the targets excluded);
    `reverse` is waited_by(graph), made once per graph."""
    seen, todo = set(), list(targets)
    while todo:
        for node in reverse.get(todo.pop(), ()):
            if node not in seen:
                seen.add(node)
                todo.append(node)
    return seen - targets


def terminal_components(graph: dict[Node, set[Node]]) -> list[set[Node]]:
    """Strongly connected components with no edge leaving them: the roots, in
    the order of their first node in `graph`.

    Tarjan's algorithm, iterative, so linear in the edges: a collective that
    a thousand ranks sit in gives a million of them (each waits on every
    other member still inside it)."""
    order = {node: index for index, node in enumerate(graph)}
    index: dict[Node, int] = {}
    low: dict[Node, int] = {}
    stack: list[Node] = []
    on_stack: set[Node] = set()
    roots = []
    for start in graph:
        if start in index:
            continue
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        work = [(start, iter(graph[start]))]
        while work:
            node, edges = work[-1]
            for out in edges:
                if out not in index:
                    index[out] = low[out] = len(index)
                    stack.append(out)
                    on_stack.add(out)
                    work.append((out, iter(graph.get(out, ()))))
                    break
                if out in on_stack and index[out] < low[node]:
                    low[node] = index[out]
            else:
                work.pop()
                if work and low[node] < low[work[-1][0]]:
                    low[work[-1][0]] = low[node]
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.add(member)
                        if member == node:
                            break
                    if node in order and all(out in component for member in component
                                             for out in graph.get(member, ())):
                        roots.append(component)
    return sorted(roots, key=lambda component: min(order[node] for node in component
                                                   if node in order))


# Verdicts, one rule each.

def dead_verdicts(view: View, graph: dict[Node, set[Node]]) -> list[Verdict]:
    """The first process to die abnormally is the culprit; later deaths and every
    process waiting on a dead one are victims."""
    clean_end = view.snapshot.command_exit == 0
    abnormal = [death for death in view.deaths.values()
                if death.exitcode not in (0, None) or (death.exitcode is None and not clean_end)]
    if not abnormal:
        return []
    first = _first_death(view, abnormal)
    state = view.state(first.node)
    dead = set(view.deaths)
    victims = (dead | reachers(waited_by(graph), dead)) - {first.node}
    later = dead - {first.node}
    tail = [f"{rank_list(_ranks_of(later), DRIVER in later)} died after it"] if later else []
    if victims - dead:
        tail.append(_victims_text(victims - dead).removeprefix("; "))
    phase = innermost(state)
    step = current_step(state)
    summary = (f"{who(view, first.node)} died {view.now - first.at:.0f} s ago "
               f"({_exit_text(first.exitcode)})"
               + (f" at step {step}" if step is not None else "")
               + (f" in {phase.name}" if phase is not None else "")
               + "".join(f"; {part}" for part in tail))
    evidence = _evidence(view, state) | {"exitcode": first.exitcode,
                                         "signal": _signal_number(first.exitcode)}
    if first.node == DRIVER:
        evidence["culprit"] = DRIVER
    return [Verdict(kind="dead", culprit_ranks=_ranks_of({first.node}),
                    victim_ranks=_ranks_of(victims), summary=summary,
                    phase=phase.name if phase else None, step=step,
                    detected_after_s=round(view.now - first.at, 3), evidence=evidence)]


def _first_death(view: View, abnormal: list[Death]) -> Death:
    """The earliest death. Deaths closer together than heartbeats can order are
    ordered by cause: one that died waiting in a collective on another dead
    process (a peer's reset connection ended its wait) came after it; then the
    one that stopped making progress first is first."""
    earliest = min(death.at for death in abnormal)
    close = [death for death in abnormal if death.at - earliest <= DEATH_SLACK_S]

    def waited_on_dead(death: Death) -> bool:
        record = view.pending.get(death.node)
        return record is not None and bool(
            record_waits(view, death.node, record) & (set(view.deaths) - {death.node}))

    return min(close, key=lambda death: (waited_on_dead(death),
                                         last_progress(view.state(death.node)), death.at))


def mismatch_verdicts(view: View) -> list[Verdict]:
    """Members at the same seq of a group that call different ops, shapes or dtypes:
    the first such seq of each group; the minority are the culprits."""
    verdicts, reported = [], set()
    disagreeing = [key for key in view.joined if key in view.disagreeing]
    for group, seq in sorted(disagreeing, key=lambda key: key[1]):
        records = view.joined[(group, seq)]
        if group in reported or len(records) < 2:
            continue
        signatures = {rank: _signature(record) for rank, record in records.items()}
        counts = Counter(signatures.values())
        if len(counts) < 2:
            continue
        reported.add(group)
        top = counts.most_common()
        majority = top[0][0] if top[0][1] > top[1][1] else None
        rhythm = None
        if majority is None:  # a tie (two ranks, say): the side that keeps the rhythm wins
            rhythm = _expected_signature(view, group, seq)
            majority = rhythm if rhythm in counts else None
        culprits = sorted(rank for rank, sig in signatures.items() if sig != majority)
        victims = sorted(rank for rank, sig in signatures.items() if sig == majority)
        calls = "; ".join(f"{rank_list(r for r, s in signatures.items() if s == sig)}: "
                          f"{_describe_call(sig)}" for sig, _ in top)
        verdicts.append(Verdict(
            kind="collective_mismatch", culprit_ranks=culprits, victim_ranks=victims,
            summary=f"{group} seq {seq}: members disagree on the collective: {calls}"
                    + (f"; {_describe_call(majority)} was due (the group's calls repeat), "
                       f"so {rank_list(culprits)} skipped or added a call" if rhythm else ""),
            group=group, seq=seq, step=current_step(view.ranks[culprits[0]]),
            evidence={"calls": {str(rank): asdict(record) for rank, record in records.items()}}))
    return verdicts


def _expected_signature(view: View, group: str, seq: int) -> tuple | None:
    """What the group's rhythm says call `seq` should be. Engine steps repeat the
    same calls, so it is the call one period back, among the calls every member
    agreed on; the period is the shortest that fits the recent history."""
    agreed = {}
    for (name, number), records in view.joined.items():
        signatures = {_signature(record) for record in records.values()}
        if name == group and number < seq and len(records) > 1 and len(signatures) == 1:
            agreed[number] = signatures.pop()
    numbers = sorted(agreed, reverse=True)
    for period in range(1, len(numbers) // 2 + 1):
        recent = numbers[:2 * period]
        if all(agreed.get(n - period, agreed[n]) == agreed[n] for n in recent):
            return agreed.get(seq - period)
    return None


def skipped_collective_verdicts(view: View, graph: dict[Node, set[Node]],
                                limits: StallLimits) -> list[Verdict]:
    """A member that has gone on past (G, S) without joining it, while others wait
    in it: it skipped the collective, whatever cycle the graph shows."""
    verdicts, named, reverse = [], set(), None
    waiting: dict[tuple[str, int], list[int]] = defaultdict(list)
    for rank, record in view.pending.items():
        if record.op not in P2P_OPS and rank not in view.deaths:
            waiting[(record.group, record.seq)].append(rank)
    for (group, seq), waiters in sorted(waiting.items()):
        since = min(view.pending[rank].t_enqueue for rank in waiters)
        stall = view.now - since
        if stall < max(limits.limit(_phase_name(view.ranks[rank])) for rank in waiters):
            continue
        for member in view.groups.get(group, []):
            if member in named or not _went_past(view, member, group, seq, waiters):
                continue
            named.add(member)
            state = view.ranks[member]
            if reverse is None:
                reverse = waited_by(graph)
            victims = reachers(reverse, {member})
            op = view.pending[waiters[0]].op
            summary = (f"{who(view, member)} never joined {group} {op} seq {seq} that "
                       f"{rank_list(sorted(waiters))} {_verb(waiters)} in for {stall:.0f} s: "
                       f"it went on to {_doing(state)}{_at_frame(state)}"
                       f"{_victims_text(victims, exclude=set(waiters))}")
            verdicts.append(_skipped_verdict(view, member, victims, summary, group, seq,
                                             stall, waiters))
    return verdicts


def _skipped_verdict(view: View, member: int, victims: set[Node], summary: str, group: str,
                     seq: int, stall: float, waiters: list[int]) -> Verdict:
    state = view.ranks[member]
    return Verdict(kind="collective_missing_peers", culprit_ranks=[member],
                   victim_ranks=_ranks_of(victims), summary=summary, phase=_phase_name(state),
                   step=current_step(state), group=group, seq=seq,
                   detected_after_s=round(stall, 3),
                   evidence=_evidence(view, state) | {"waiting_ranks": sorted(waiters)})


def skipped_p2p_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits,
                         found: list[Verdict]) -> list[Verdict]:
    """A peer that went on past its side of a send/recv a rank waits in: it skipped
    the call (a stage that never sent), whatever cycle through the driver the
    graph shows."""
    verdicts, named = [], {rank for verdict in found for rank in verdict.culprit_ranks}
    for rank, record in sorted(view.pending.items()):
        if record.op not in P2P_OPS or rank in view.deaths or record.peer in named:
            continue
        stall = view.now - record.t_enqueue
        if stall < limits.limit(_phase_name(view.ranks[rank])):
            continue
        peer, other = record.peer, "recv" if record.op == "send" else "send"
        if not _went_past_p2p(view, peer, other, rank, record):
            continue
        named.add(peer)
        state = view.ranks[peer]
        victims = reachers(waited_by(graph), {peer})
        arrow = f"->{rank}" if other == "send" else f"<-{rank}"
        summary = (f"{who(view, peer)} never made its {record.group} {other}{arrow} "
                   f"#{record.seq} that rank {rank} waits in for {stall:.0f} s: it went on "
                   f"to {_doing(state)}{_at_frame(state)}"
                   f"{_victims_text(victims, exclude={rank})}")
        verdicts.append(_skipped_verdict(view, peer, victims, summary, record.group,
                                         record.seq, stall, [rank]))
    return verdicts


def _went_past_p2p(view: View, peer: int, op: str, rank: int, record: CollectiveRecord) -> bool:
    if peer in view.deaths or peer not in view.ranks:
        return False
    if view.highest_seq.get((record.group, op, peer, rank), -1) >= record.seq:
        return False
    pending = view.pending.get(peer)
    if pending is not None and pending.op in P2P_OPS and pending.peer == rank:
        return False
    ahead, behind = position(view.ranks[peer]), position(view.ranks[rank])
    return ahead is not None and behind is not None and ahead[0] > behind[0]  # left the step


def _went_past(view: View, member: int, group: str, seq: int, waiters: list[int]) -> bool:
    if member in view.deaths or member not in view.ranks or view.has_joined(member, group, seq):
        return False
    pending = view.pending.get(member)
    if pending is not None and pending.group == group:
        return False
    ahead = position(view.ranks[member])
    if ahead is None:
        return False
    for rank in waiters:
        behind = position(view.ranks[rank])
        if behind is None or ahead <= behind:
            return False
    return True


def root_verdicts(view: View, graph: dict[Node, set[Node]], limits: StallLimits,
                  named: set[int]) -> list[Verdict]:
    """One verdict for each root of the wait-for graph that has stalled."""
    found, reverse = [], waited_by(graph)
    for component in terminal_components(graph):
        if component & (named | set(view.deaths)):
            continue
        victims = reachers(reverse, component)
        if len(component) == 1:
            verdict = _single_root(view, next(iter(component)), victims, limits)
        else:
            verdict = _cycle_root(view, component, victims, limits)
        if verdict is not None:
            found.append(verdict)
    return sorted(found, key=lambda verdict: -(verdict.detected_after_s or 0.0))


def _single_root(view: View, node: Node, victims: set[Node], limits: StallLimits) -> Verdict | None:
    state = view.state(node)
    has_phase = innermost(state) is not None
    if node == DRIVER and not has_phase:
        return None                      # an idle driver: the server has nothing to do
    if not has_phase and not victims and state.identity.role != "worker":
        return None                      # nothing says this process should be doing anything
    if not has_phase and (view.snapshot.command_exit is not None
                          or _driver_shutting_down(view.snapshot)):
        return None                      # the job is ending: the rank is on its way out
    if node in view.pending and gpu_behind(view.pending[node]):
        return _gpu_stuck(view, node, victims, limits)
    stall = view.now - _stalled_since(view, node, victims)
    if stall < limits.limit(limit_phase(view, node)):
        return None
    kind, reached = _root_kind(view, node)
    group, seq = _waited_collective(view, node, victims)
    if kind == "stuck_in_phase" and not (state.phases or state.open_phases) and group is not None:
        kind = "collective_missing_peers"
    step = current_step(state)
    summary = _root_summary(view, node, kind, reached, stall, victims, group, seq)
    evidence = _evidence(view, state)
    if node == DRIVER:
        evidence["culprit"] = DRIVER
    phase = reached if kind == "never_reached" else _phase_name(state)
    return Verdict(kind=kind, culprit_ranks=_ranks_of({node}), victim_ranks=_ranks_of(victims),
                   summary=summary, phase=phase, step=step,
                   group=group, seq=seq, detected_after_s=round(stall, 3), evidence=evidence)


def _gpu_stuck(view: View, node: int, victims: set[Node], limits: StallLimits) -> Verdict | None:
    """The rank's host enqueued a call and went on; its GPU never reached the call."""
    state = view.ranks[node]
    record = view.pending[node]
    stall = view.now - max(record.t_enqueue, device_progress(state))
    if stall < limits.limit(limit_phase(view, node)):
        return None
    done = [r for r in state.collectives if r.t_device_done is not None]
    after = f", after {_call_name(done[-1])}" if done else ""
    site = f" (enqueued at {record.site})" if record.site else ""
    summary = (f"{who(view, node)}: the GPU has not reached {_call_name(record)}{site} for "
               f"{stall:.0f} s, stuck in the work before it{after}; the host is "
               f"{where(state).removeprefix('stuck ')}{_step_text(state)}{_at_frame(state)}"
               f"{_victims_text(victims)}")
    evidence = _evidence(view, state)
    evidence["device"] = {"not_reached": asdict(record),
                          "last_finished": asdict(done[-1]) if done else None,
                          "host": f"{where(state).removeprefix('stuck ')}{_at_frame(state)}"}
    evidence["victims_on_device"] = {
        str(rank): _call_name(view.pending[rank]) for rank in _ranks_of(victims)
        if rank in view.pending and view.pending[rank].t_device_start is not None}
    return Verdict(kind="gpu_stuck", culprit_ranks=[node], victim_ranks=_ranks_of(victims),
                   summary=summary, phase=_phase_name(state), step=current_step(state),
                   group=record.group, seq=record.seq, detected_after_s=round(stall, 3),
                   evidence=evidence)


def _call_name(record: CollectiveRecord) -> str:
    return f"{record.group} {record.op} seq {record.seq}"


def _cycle_root(view: View, component: set[Node], victims: set[Node],
                limits: StallLimits) -> Verdict | None:
    """Processes that wait on each other: a deadlock, or a collective stuck with all
    its members inside."""
    stall = min(view.now - last_progress(view.state(node)) for node in component)
    limit = max(limits.limit(limit_phase(view, node)) for node in component)
    if stall < limit:
        return None
    members = _ranks_of(component)
    first = view.state(members[0] if members else DRIVER)
    record = view.pending.get(members[0]) if members else None
    what = (f"{record.group} {record.op} seq {record.seq}" if record is not None
            else _phase_name(first) or "their phases")
    names = rank_list(members, driver=DRIVER in component)
    summary = (f"{names} wait on each other in {what} for {stall:.0f} s"
               f"{_victims_text(victims)}")
    return Verdict(kind="stuck_in_phase", culprit_ranks=members, victim_ranks=_ranks_of(victims),
                   summary=summary, phase=_phase_name(first), step=current_step(first),
                   group=record.group if record else None, seq=record.seq if record else None,
                   detected_after_s=round(stall, 3),
                   evidence={"cycle": [str(node) for node in sorted(component, key=str)]})


def _stalled_since(view: View, node: Node, victims: set[Node]) -> float:
    """When the process stopped moving. A worker that has not read a broadcast its
    peers took stalls from the moment they started that step; a rank that left
    no trace at all (a missing dump) from when the first rank began to wait."""
    state = view.state(node)
    if node != DRIVER and not (state.collectives or state.phases or state.open_phases):
        waits = [view.pending[rank].t_enqueue for rank in _ranks_of(victims) if rank in view.pending]
        return min(waits, default=state.started_at)
    since = last_progress(state)
    if node != DRIVER and ring_behind(view, node):
        done = last_step(state)
        starts = [event.start for other, peer in view.ranks.items() if other != node
                  for event in peer.phases + peer.open_phases
                  if event.name == "execute_model" and event.step is not None
                  and (done is None or event.step > done)]
        if starts:
            since = max(since, min(starts))
    return since


def _root_kind(view: View, node: Node) -> tuple[str, str | None]:
    """The verdict kind for a stalled root, and the milestone it never reached."""
    if node == DRIVER:
        return "stuck_in_phase", None
    state = view.ranks[node]
    if state.identity.role == "process":
        missed = _phase_missed(view, node)
        if missed is not None:
            return "never_reached", missed
    peers = [milestone(other) for rank, other in view.ranks.items() if rank != node]
    furthest = max(peers, default=-1)
    if milestone(state) < furthest:
        return "never_reached", MILESTONES[furthest]
    if ring_behind(view, node):
        return "broadcast_not_consumed", None
    return "stuck_in_phase", None


def _phase_missed(view: View, node: Node) -> str | None:
    """Generic mode (phases from --mark): the first phase every other process
    entered and this one never did."""
    entered = {rank: {event.name: event.start for event in state.phases + state.open_phases}
               for rank, state in view.ranks.items()}
    others = [names for rank, names in entered.items() if rank != node]
    if not others:
        return None
    missed = set.intersection(*(set(names) for names in others)) - set(entered[node])
    return min(missed, key=lambda name: min(names[name] for names in others), default=None)


def _waited_collective(view: View, node: Node, victims: set[Node]) -> tuple[str | None, int | None]:
    """The group collective that victims wait in for this rank to join; where
    several, the one this rank alone is missing from (what the majority did)."""
    candidates = set()
    for rank in _ranks_of(victims):
        record = view.pending.get(rank)
        if (record is not None and record.op not in P2P_OPS and node in view.groups.get(record.group, [])
                and not view.has_joined(node, record.group, record.seq)):
            candidates.add((record.group, record.seq))
    if not candidates:
        return None, None

    def missing(candidate):
        group, seq = candidate
        return sum(not view.has_joined(member, group, seq) for member in view.groups[group])

    return min(candidates, key=lambda candidate: (missing(candidate), candidate))


def _root_summary(view: View, node: Node, kind: str, reached: str | None, stall: float,
                  victims: set[Node], group: str | None, seq: int | None) -> str:
    state = view.state(node)
    name = who(view, node)
    if state.phases or state.open_phases:
        stuck = f"{where(state)}{_step_text(state)} for {stall:.0f} s{_at_frame(state)}"
    else:
        stuck = _last_call_text(state, stall)
    tail = _victims_text(victims)
    if kind == "never_reached":
        return f"{name} never reached {reached}: {stuck}{tail}"
    if kind == "broadcast_not_consumed":
        driver = view.driver
        return (f"{name} stopped taking the driver's broadcast: it read {state.ring_read} of "
                f"{driver.ring_written} messages while its peers read more; {stuck}{tail}")
    if kind == "collective_missing_peers":
        op = next(record.op for record in view.pending.values()
                  if (record.group, record.seq) == (group, seq))
        return f"{name} never joined {group} {op} seq {seq}: {stuck}{tail}"
    return f"{name} {stuck}{tail}"


def _last_call_text(state: RankState, stall: float) -> str:
    """Where a rank without phase data is: its last collective call."""
    if not state.collectives:
        return "it made no collective call"
    record = state.collectives[-1]
    site = f" at {record.site}" if record.site else ""
    return (f"its last call, {record.group} {record.op} seq {record.seq}{site}, "
            f"was {stall:.0f} s before the snapshot")


def straggler_verdicts(view: View, thresholds: Thresholds) -> list[Verdict]:
    """A rank whose own work per step (time in execute_model not spent waiting in a
    collective) is consistently far above its peers'. TP peers do the same work;
    without TP every other rank is a peer."""
    own = {rank: _own_step_times(state) for rank, state in view.ranks.items()
           if rank not in view.deaths}
    verdicts = []
    for rank, steps in own.items():
        if len(steps) < thresholds.straggler_min_steps:
            continue                    # too few steps of its own to be common with peers'
        peers = _step_peers(view, rank)
        theirs_by_peer = [own[peer] for peer in peers if peer in own]
        peer_steps = set().union(*theirs_by_peer)
        common = [step for step in steps if step in peer_steps]
        if len(common) < thresholds.straggler_min_steps:
            continue
        mine = median([steps[step] for step in common])
        theirs = median([times[step] for step in common for times in theirs_by_peer
                         if step in times])
        if mine < thresholds.straggler_ratio * theirs or mine - theirs < thresholds.straggler_margin_s:
            continue
        peers_waiting = sorted(peer for peer in peers if peer in own)
        summary = (f"{who(view, rank)} is a straggler: its own work takes {mine:.2f} s a step "
                   f"against {theirs:.2f} s on {rank_list(peers_waiting)} "
                   f"(median of {len(common)} steps); it makes progress, not a hang")
        verdicts.append(Verdict(
            kind="straggler", culprit_ranks=[rank], victim_ranks=peers_waiting, summary=summary,
            phase=_phase_name(view.ranks[rank]), step=current_step(view.ranks[rank]),
            evidence={"own_step_s": {str(step): round(steps[step], 4) for step in common},
                      "peer_median_s": round(theirs, 4)}))
    return verdicts


def _own_step_times(state: RankState) -> dict[int, float]:
    """Step -> seconds of the rank's own work: from the end of the dequeue that
    gave it the step to the end of execute_model, less the time spent waiting in
    collectives. Only steps that the rank's record ring fully covers count."""
    steps = sorted((event for event in state.phases if event.name == "execute_model"
                    and event.end is not None and event.step is not None),
                   key=lambda event: event.start)
    if not steps:
        return {}
    covered_from = min(map(ENQUEUED_AT, state.collectives), default=None)
    dequeued = sorted(event.end for event in state.phases
                      if event.name == "dequeue" and event.end is not None)
    # Completed calls by enqueue time (a stable sort, and nearly always sorted
    # already), so each step's calls are one slice found by bisection.
    calls = sorted([record for record in state.collectives if record.t_complete is not None],
                   key=ENQUEUED_AT)
    enqueued = list(map(ENQUEUED_AT, calls))
    times, previous_end = {}, None
    for event in steps:
        start = event.start
        last = bisect_right(dequeued, event.start) - 1   # the last dequeue ended by then
        if last >= 0 and (previous_end is None or dequeued[last] >= previous_end):
            start = dequeued[last]
        previous_end = event.end
        if covered_from is not None and start < covered_from:
            continue
        waited = sum(record.t_complete - record.t_enqueue for record in
                     calls[bisect_left(enqueued, start):bisect_right(enqueued, event.end)])
        times[event.step] = max(0.0, event.end - start - waited)
    return times


def _step_peers(view: View, rank: int) -> list[int]:
    ident = view.ranks[rank].identity
    if ident.tp_size and ident.tp_size > 1 and ident.pp_rank is not None:
        group = view.groups.get(f"tp{ident.pp_rank}", [])
        return [peer for peer in group if peer != rank]
    return [peer for peer in view.ranks if peer != rank]


# Words.

def who(view: View, node: Node) -> str:
    if node == DRIVER:
        return "the driver"
    ident = view.ranks[node].identity
    if ident.pp_rank is not None and ident.tp_rank is not None:
        return f"rank {node} (pp {ident.pp_rank}/{ident.pp_size}, tp {ident.tp_rank})"
    return f"rank {node}"


def rank_list(ranks, driver: bool = False) -> str:
    """[0, 1, 2, 3, 4, 5, 7] -> 'ranks 0-5 and 7'; [3] -> 'rank 3'; with
    driver=True the driver ends the list."""
    ranks = sorted(ranks)
    runs, start = [], None
    for index, rank in enumerate(ranks):
        if start is None:
            start = rank
        if index + 1 == len(ranks) or ranks[index + 1] != rank + 1:
            runs.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    if runs:
        runs[0] = f"{'rank' if len(ranks) == 1 else 'ranks'} {runs[0]}"
    if driver:
        runs.append("the driver")
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


def _victims_text(victims: set[Node], exclude: set[Node] = frozenset()) -> str:
    ranks = [rank for rank in _ranks_of(victims) if rank not in exclude]
    driver = DRIVER in victims
    if not ranks and not driver:
        return ""
    return f"; {rank_list(ranks, driver)} {_verb(ranks + [DRIVER] * driver)} on it"


def _verb(ranks) -> str:
    return "wait" if len(ranks) > 1 else "waits"


def _step_text(state: RankState) -> str:
    phase = innermost(state)
    if phase is None or phase.name == "dequeue":
        return ""
    step = current_step(state)
    return f" at step {step}" if step is not None else ""


def _doing(state: RankState) -> str:
    """'dequeue for step 5', 'pp_send at step 4': where a rank went on to."""
    phase = innermost(state)
    if phase is None:
        return where(state).removeprefix("stuck ")
    step = current_step(state)
    if step is None:
        return phase.name
    return f"{phase.name} {'for' if phase.name == 'dequeue' else 'at'} step {step}"


def _at_frame(state: RankState) -> str:
    return f" at {state.frame}" if state.frame else ""


def _exit_text(exitcode: int | None) -> str:
    if exitcode is None:
        return "process gone, exit code unknown"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = "signal"
        return f"killed by signal {-exitcode}, {name}"
    return f"exit code {exitcode}"


def _signal_number(exitcode: int | None) -> int | None:
    return -exitcode if exitcode is not None and exitcode < 0 else None


def _signature(record: CollectiveRecord) -> tuple:
    return (record.op, tuple(tuple(shape) for shape in record.shapes), record.dtype)


def _describe_call(signature: tuple) -> str:
    op, shapes, dtype = signature
    return f"{op} {[list(shape) for shape in shapes]} {dtype}"


def _phase_name(state: RankState) -> str | None:
    phase = innermost(state)
    return phase.name if phase is not None else None


def _ranks_of(nodes) -> list[int]:
    return sorted(node for node in nodes if node != DRIVER)


def _evidence(view: View, state: RankState) -> dict:
    evidence = {
        "pid": state.identity.pid, "host": state.identity.host, "alive": state.alive,
        "frame": state.frame,
        "open_phases": [f"{event.name}" + (f"[{event.step}]" if event.step is not None else "")
                        for event in state.open_phases],
        "heartbeat_age_s": round(view.now - state.heartbeat_at, 3),
        "last_records": [asdict(record) for record in state.collectives[-LAST_RECORDS:]],
    }
    if state.stacks:
        evidence["stacks"] = state.stacks
    if state.fault is not None:
        evidence["fault"] = asdict(state.fault)
    return evidence
