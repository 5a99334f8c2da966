"""What the collector reads from a run dir, and what the analysis takes: plain data."""
from __future__ import annotations

from dataclasses import dataclass, field

# Phases the engine marks, in the order a rank meets them.
STARTUP_PHASES = ("init_distributed", "load_weights", "init_kv_cache", "warmup")
STEP_PHASES = ("dequeue", "execute_model", "pp_recv", "forward", "pp_send", "sample")
DRIVER_PHASES = ("schedule", "execute_model", "update_from_output", "shutdown")


@dataclass
class Identity:
    role: str                      # "worker", "driver" or "process" (generic mode)
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


@dataclass
class PhaseEvent:
    name: str
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

    @property
    def phase(self) -> PhaseEvent | None:
        return self.open_phases[-1] if self.open_phases else None


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
class Snapshot:
    taken_at: float
    run_dir: str
    ranks: dict[int, RankState]
    driver: RankState | None = None
    command_exit: int | None = None  # the wrapped command's exit code, once it ended
    notes: list[str] = field(default_factory=list)  # files that could not be read, and why
    nodes: list[NodeState] = field(default_factory=list)  # the other nodes (multi-node only)


@dataclass
class Verdict:
    kind: str   # never_reached, stuck_in_phase, collective_missing_peers, collective_mismatch,
                # dead, straggler, broadcast_not_consumed, gpu_stuck, node_lost
    culprit_ranks: list[int]
    victim_ranks: list[int]
    summary: str
    phase: str | None = None
    step: int | None = None
    group: str | None = None
    seq: int | None = None
    detected_after_s: float | None = None
    evidence: dict = field(default_factory=dict)


def ranks_from_dicts(ranks: dict) -> dict[int, RankState]:
    """RankStates from their dataclasses.asdict() form (a node's published snapshot);
    ValueError on anything malformed."""
    try:
        return {int(rank): _rank_state(state) for rank, state in ranks.items()}
    except (TypeError, AttributeError, KeyError, ValueError) as error:
        raise ValueError(f"malformed rank state: {error}") from None


def _rank_state(data: dict) -> RankState:
    data = dict(data)
    data["identity"] = Identity(**data["identity"])
    data["open_phases"] = [PhaseEvent(**event) for event in data["open_phases"]]
    data["phases"] = [PhaseEvent(**event) for event in data["phases"]]
    data["collectives"] = [CollectiveRecord(**record) for record in data["collectives"]]
    data["kv"] = KVStats(**data["kv"]) if data.get("kv") else None
    data["fault"] = FaultRecord(**data["fault"]) if data.get("fault") else None
    data["worker_exits"] = [WorkerExit(**exit) for exit in data.get("worker_exits", [])]
    return RankState(**data)
