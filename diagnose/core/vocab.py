"""The names that cross rooms: the phases a rank marks, the kinds of verdict, the
roles of a process, what a rank is doing, the calls the probe records, the kinds
of injected fault. Each is a `str` enum, so it is written
to files and JSON as its plain value, and a value read back compares equal to
its member."""
from __future__ import annotations

from enum import Enum


class Name(str, Enum):
    def __str__(self) -> str:
        return self.value


class Phase(Name):
    # start-up, once per worker, in this order
    INIT_DISTRIBUTED = "init_distributed"
    LOAD_WEIGHTS = "load_weights"
    INIT_KV_CACHE = "init_kv_cache"
    WARMUP = "warmup"
    # a worker's step loop
    DEQUEUE = "dequeue"
    EXECUTE_MODEL = "execute_model"
    PP_RECV = "pp_recv"
    FORWARD = "forward"
    PP_SEND = "pp_send"
    SAMPLE = "sample"
    # the driver's step
    SCHEDULE = "schedule"
    UPDATE_FROM_OUTPUT = "update_from_output"
    SHUTDOWN = "shutdown"
    # every probe: a process that ended normally enters it last
    EXIT = "exit"


STARTUP_PHASES = (Phase.INIT_DISTRIBUTED, Phase.LOAD_WEIGHTS, Phase.INIT_KV_CACHE, Phase.WARMUP)
STEP_PHASES = (Phase.DEQUEUE, Phase.EXECUTE_MODEL, Phase.PP_RECV, Phase.FORWARD, Phase.PP_SEND,
               Phase.SAMPLE)
DRIVER_PHASES = (Phase.SCHEDULE, Phase.EXECUTE_MODEL, Phase.UPDATE_FROM_OUTPUT, Phase.SHUTDOWN)
MILESTONES = STARTUP_PHASES + (Phase.EXECUTE_MODEL,)  # what a worker meets once, in order


class VerdictKind(Name):
    NEVER_REACHED = "never_reached"
    STUCK_IN_PHASE = "stuck_in_phase"
    COLLECTIVE_MISSING_PEERS = "collective_missing_peers"
    COLLECTIVE_MISMATCH = "collective_mismatch"
    BROADCAST_NOT_CONSUMED = "broadcast_not_consumed"
    GPU_STUCK = "gpu_stuck"
    DEAD = "dead"
    NODE_LOST = "node_lost"
    STATE_UNREADABLE = "state_unreadable"
    RAISED = "raised"                  # a phase ended in the job's first exception
    COMPILE_TOO_LONG = "compile_too_long"  # compiling past the compile limit
    STRAGGLER = "straggler"


# The kinds that stop a job: the launcher dumps, reports and (with --on-hang kill)
# ends the run on these; a straggler makes progress.
HANG_KINDS = frozenset(VerdictKind) - {VerdictKind.STRAGGLER}


class Activity(Name):
    """What a rank's main thread is doing now, read from its live stack
    (diagnose/analysis/activity.py holds the table of frames behind each)."""
    COLLECTIVE = "collective"  # waits in a collective: gloo, NCCL, vLLM's shm all-reduce, ...
    GPU_WAIT = "gpu_wait"      # waits for its GPU: a stream or event sync, .item(), .tolist()
    IDLE = "idle"              # waits for work: a broadcast ring, a zmq poll
    COMPILING = "compiling"    # Dynamo, Inductor, a Triton JIT, a compiler child, a cache lock
    SLEEPING = "sleeping"      # time.sleep, or blocked on something outside the job
    RUNNING = "running"        # its own code
    UNKNOWN = "unknown"        # no stack to read


class RankStatus(Name):
    """What the rank table and the TUI call a rank, from the verdicts and whether
    its process runs."""
    CULPRIT = "culprit"
    VICTIM = "victim"      # waits on a culprit (as the job stood when it was judged)
    DEAD = "dead"          # a death verdict names it: it died, abnormally
    EXITED = "exited"      # ended normally (its probe entered Phase.EXIT last)
    ENDED = "ended"        # its process is gone, with no normal end marked and no verdict
                           # that calls it a death: diag stopped it, or the job ended
                           # after the hang
    RUNNING = "running"


class Mention(Name):
    """Whom a stretch of a verdict's sentence names."""
    CULPRIT = "culprit"
    VICTIMS = "victims"


class Role(Name):
    WORKER = "worker"      # a TP x PP rank of the engine
    DRIVER = "driver"      # the engine's scheduler process, not a rank
    PROCESS = "process"    # a rank of a program we did not write (generic mode)
    FRONTEND = "frontend"  # vLLM's API server (the engine core's client): no probe, one hook


class Op(Name):
    """A call the probe records (CollectiveRecord.op); a Flight Recorder dump may
    hold others (all_to_all, ...), kept as torch names them."""
    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    GATHER = "gather"
    BARRIER = "barrier"
    SEND = "send"
    RECV = "recv"


P2P_OPS = (Op.SEND, Op.RECV)


def paired_op(op: str) -> Op:
    """The other side of a point-to-point call: a send meets a recv."""
    return Op.RECV if op == Op.SEND else Op.SEND


class FaultKind(Name):
    """What an injected fault does (diagnose/probe/faults.py says each)."""
    HANG = "hang"
    SPIN = "spin"
    SLEEP = "sleep"
    CRASH = "crash"
    EXIT = "exit"
    SKIP_COLLECTIVE = "skip_collective"
    SKIP_BROADCAST = "skip_broadcast"
    RAISE = "raise"
    GPU_SPIN = "gpu_spin"
    DEVICE_ASSERT = "device_assert"
