"""What the collector reads from a run dir, and what the analysis takes: plain data."""
from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.core.checked import checked
from diagnose.core.layout import rank_name
from diagnose.core.vocab import Mention, Phase, VerdictKind


@dataclass
class Identity:
    role: str                      # a vocab.Role
    rank: int | None
    world_size: int | None
    tp_rank: int | None
    tp_size: int | None
    pp_rank: int | None
    pp_size: int | None
    host: str
    pid: int
    device: str
    env: dict[str, str] = field(default_factory=dict)        # CUDA_LAUNCH_BLOCKING, NCCL_* in force
    groups: dict[str, list[int]] = field(default_factory=dict)  # group name -> member ranks
    label: str | None = None       # the rank's name in its own program: vLLM's "Worker_PP1_TP0"

    @property
    def name(self) -> str:
        """'rank 6 (pp 3/4, tp 0)', 'rank 3', or 'the driver'; where the program's
        own name says more than pp and tp (vLLM's DP or PCP), 'rank 6 (Worker_PP1_PCP1_TP0)'."""
        if self.rank is None:
            return "the driver"
        if self.label and ("_DP" in self.label or "_PCP" in self.label):
            return f"rank {self.rank} ({self.label})"
        return rank_name(self.rank, self.pp_rank, self.pp_size, self.tp_rank)


@dataclass
class PhaseEvent:
    name: str                      # a vocab.Phase, or a --mark's own name
    step: int | None
    start: float                   # time.time()
    end: float | None              # None while the phase is open


@dataclass
class CollectiveRecord:
    group: str                     # "tp0" (TP group of stage 0), "pp", "world", ...
    seq: int                       # per group; for send/recv per (group, op, peer)
    op: str                        # all_reduce, all_gather, broadcast, send, recv, barrier, ...
    peer: int | None               # send/recv: the other rank
    shapes: list[list[int]]
    dtype: str
    nbytes: int
    site: str                      # "file.py:123 function"
    state: str                     # "enqueued" or "completed"
    t_enqueue: float
    t_complete: float | None       # when the host call returned
    device: bool = False           # traced on the GPU: the two times below get filled in
    t_device_start: float | None = None  # when the probe saw the GPU reach the call
    t_device_done: float | None = None   # when the probe saw the GPU finish it
    # Flight Recorder only: the calls of a coalesced group share one seq; part is
    # a call's place in its group (None: the dump's ring cut the group's start).
    part: int | None = 0
    out_shapes: list[list[int]] | None = None   # output sizes, where the source has them
    out_dtype: str | None = None


@dataclass
class DeviceWork:
    """Work a rank's host enqueued on its GPU, up to the end of a step phase, that
    the GPU had not finished when the probe last looked."""
    phase: str
    step: int | None
    host_left_at: float            # when the host left the phase (and went on)


@dataclass
class KVStats:
    step: int
    used: int
    free: int
    allocated: int                 # cumulative
    freed: int                     # cumulative
    preempted: int                 # cumulative


@dataclass
class FaultRecord:
    spec: str
    fired_at: float | None


@dataclass
class WorkerExit:
    rank: int
    exitcode: int | None           # negative: killed by signal -exitcode
    at: float


@dataclass
class ActivitySample:
    """What a rank's main thread was doing when diag looked from outside (py-spy),
    classified by analysis.activity (state-R.json)."""
    activity: str                  # a vocab.Activity
    taken_at: float                # when the look began: what it found holds from then
    pid: int
    frame: str | None = None       # the frame that decided it
    rule: str | None = None        # the row of analysis.activity.ROWS (or "compile-child")
    frames: list[str] = field(default_factory=list)  # the main thread, outermost first
    native: bool = False           # the frames include native ones (py-spy --native)
    note: str | None = None        # why not native, or why no stack at all
    compiling_since: float | None = None  # compiling in every sample since then
    compiled_at: float | None = None      # the last sample that found it compiling
    busy: bool = False             # its process used CPU since the sample before (2% of the
                                   # time at least): it computes, it is not blocked
    denied: bool = False           # ptrace was refused: no sample of it will read a stack
    done_at: float | None = None   # when the look ended (None: at taken_at); on a loaded
                                   # host a dump takes 10 s and more

    def text(self, now: float) -> str:
        """'compiling 42 s', 'collective', 'sleeping': for people."""
        if self.compiling_since is not None:
            return f"compiling {max(0.0, now - self.compiling_since):.0f} s"
        return str(self.activity)


@dataclass
class RaisedError:
    """The first exception that left one of the rank's phases (error-R.json)."""
    pid: int
    at: float
    phase: str
    step: int | None
    error: str                     # "RuntimeError: ..." (its last line)
    frame: str | None              # the innermost frame of the program's own code


@dataclass
class CpuWait:
    """How long, in all, the process's threads had waited for a CPU by then: the
    run delay /proc/PID/task/TID/schedstat counts (time runnable but not run)."""
    at: float
    waited_s: float


@dataclass
class Pause:
    """diag launch held a rank stopped while py-spy read its native stack: from
    start to end (None: still)."""
    rank: int
    start: float
    end: float | None = None


@dataclass
class HostLoad:
    """How starved for CPU the host that judges was, when the snapshot was taken."""
    load_per_cpu: float            # 1-minute load average over the CPUs this process may use
    cpu_pressure: float | None = None  # PSI cpu "some": share of the last ~10 s in which some
                                       # task waited for a CPU; None where the kernel has no PSI


@dataclass
class RankState:
    identity: Identity
    started_at: float
    heartbeat_at: float            # last heartbeat, time.time()
    alive: bool                    # the pid still runs (checked by the collector)
    open_phases: list[PhaseEvent]  # outermost first; the innermost is where the rank is
    frame: str                     # main thread's current frame, "file.py:88 function"
    phases: list[PhaseEvent]       # recent closed and open phases (ring)
    collectives: list[CollectiveRecord]  # recent records (ring)
    kv: KVStats | None = None
    ring_read: int = 0             # worker: broadcast messages dequeued
    ring_written: int = 0          # driver: broadcast messages written
    fault: FaultRecord | None = None
    worker_exits: list[WorkerExit] = field(default_factory=list)  # driver only
    stacks: dict[str, list[str]] | None = None  # thread name -> frames, from a dump
    device_done_at: float | None = None          # on a GPU: when the probe last saw it finish
    device_pending: DeviceWork | None = None     # the oldest step work it has not finished
    frame_moved_at: float | None = None  # when the collector last saw `frame` change; None:
                                         # not seen (a single read, a post-mortem)
    activity: ActivitySample | None = None  # its last state sample (diag launch takes them)
    error: RaisedError | None = None        # the first exception that left a phase
    cpu_waits: list[CpuWait] = field(default_factory=list)  # a sample a second, oldest first:
                                    # the time it waited for a CPU (local processes only)
    progress_at: float | None = None  # set by a node's agent while it holds back the
                                      # rank's rings: its last progress, which they lack

    @property
    def phase(self) -> PhaseEvent | None:
        return self.open_phases[-1] if self.open_phases else None

    @property
    def last_sign_of_life(self) -> float:
        """Its last heartbeat, or a phase it entered or left, or its exception,
        after it."""
        raised = [self.error.at] if self.error is not None else []
        return max([self.heartbeat_at] + raised + [max(event.start, event.end or 0.0)
                                                   for event in self.phases + self.open_phases])

    @property
    def only_stacks(self) -> bool:
        """Known only by what was seen from outside (diag attach): a sample of what
        it does and its stacks, no phase or collective of its own."""
        return self.activity is not None and not (self.phases or self.open_phases
                                                  or self.collectives)

    @property
    def ended_normally(self) -> bool:
        """Its probe marked a normal interpreter end: Phase.EXIT, entered last."""
        events = self.phases + self.open_phases
        return bool(events) and max(events, key=lambda event: event.start).name == Phase.EXIT


@dataclass
class NodeState:
    """Another node of a multi-node job, as the head's collector last heard from it."""
    node_rank: int
    host: str
    ranks: list[int]               # the ranks its last snapshot held
    last_seen: float | None        # when its agent last published; None: never
    finished: bool = False         # its command ended and its agent said goodbye
    lost: bool = False             # its agent went silent while the job ran


@dataclass
class Stop:
    """diag launch stopped the command: when it began to, and which of the probed
    processes still ran then (the others had ended before)."""
    at: float
    ranks: list[int]
    driver: bool


@dataclass
class Stopping:
    """The command began to stop the job itself (vLLM's API server, at its
    shutdown), before it ended any process (stopping.json)."""
    at: float
    pid: int


@dataclass
class Snapshot:
    taken_at: float
    run_dir: str
    ranks: dict[int, RankState]
    driver: RankState | None = None
    command_exit: int | None = None  # the wrapped command's exit code, once it ended
    stop: Stop | None = None         # set when diag launch stopped the command
    stopping: Stopping | None = None  # set when the command began to stop the job itself
    notes: list[str] = field(default_factory=list)  # files that could not be read, and why
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why its file cannot be read
    nodes: list[NodeState] = field(default_factory=list)  # the other nodes (multi-node only)
    sampling: bool = False   # diag launch is taking state samples of the still ranks (live)
    host: HostLoad | None = None  # the judging host's CPU load (live only)
    paused: list[Pause] = field(default_factory=list)  # diag's own stops of ranks (live only)


@dataclass
class Crash:
    """The first failure of a job that ended by itself after a rank failed."""
    rank: int
    at: float
    summary: str            # "rank 2 (pp 1/2, tp 0) raised AssertionError: ... in execute_model"


@dataclass
class Span:
    """Where a verdict's summary names its culprit or the processes that wait on
    it: renderers colour summary[start:end] without reading the words."""
    start: int
    end: int
    mention: Mention


@dataclass
class Verdict:
    kind: VerdictKind
    culprit_ranks: list[int]
    victim_ranks: list[int]
    summary: str
    spans: list[Span] = field(default_factory=list)
    phase: str | None = None
    step: int | None = None
    group: str | None = None
    seq: int | None = None
    detected_after_s: float | None = None
    evidence: dict = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        """A verdict from its dataclasses.asdict() form, every field checked;
        ValueError on anything malformed."""
        return checked(cls, data)


@dataclass(frozen=True)
class Judged:
    """One poll's snapshot and the verdicts on it, published as one: a reader
    never pairs a snapshot with the verdicts of another poll."""
    snapshot: Snapshot
    verdicts: tuple[Verdict, ...] = ()


def ranks_from_dicts(ranks: dict) -> dict[int, RankState]:
    """RankStates from their dataclasses.asdict() form (a node's published snapshot),
    every field checked; ValueError on anything malformed."""
    try:
        return {int(rank): checked(RankState, state) for rank, state in ranks.items()}
    except (TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"malformed rank state: {error}") from None


def snapshot_from_dict(data: dict, run_dir: str) -> Snapshot:
    """A Snapshot from its dataclasses.asdict() form (diag attach's snapshot.json),
    every field checked; ValueError on anything malformed. run_dir is where it
    was read, whatever the file says."""
    if not isinstance(data, dict) or not isinstance(data.get("ranks"), dict):
        raise ValueError("malformed snapshot: no object of ranks")
    driver, unreadable = data.get("driver"), data.get("unreadable", {})
    rest = {key: value for key, value in data.items()
            if key not in ("ranks", "driver", "unreadable", "run_dir")}
    try:
        snapshot = checked(Snapshot, rest | {"run_dir": run_dir, "ranks": {}})
        snapshot.driver = None if driver is None else checked(RankState, driver)
        snapshot.unreadable = {int(rank): checked_str(why) for rank, why in unreadable.items()}
    except (TypeError, AttributeError, ValueError) as error:
        raise ValueError(f"malformed snapshot: {error}") from None
    snapshot.ranks = ranks_from_dicts(data["ranks"])
    return snapshot


def checked_str(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{str(value)[:40]!r} is not a string")
    return value
