"""Synthetic jobs of any size, with a planted culprit: for tests, benchmarks, and
for trying `diag tui` / `diag analyze` on a thousand ranks without a thousand
processes.

    diag synth OUT --ranks 1024 --tp 8 --culprit 1000 --kind never_reached [--fr-dumps] [--beat]

`Job` plays the probe of a TP x PP engine into a Snapshot: start-up phases, then
steps (dequeue, execute_model, pp_recv, forward with its TP all_reduces,
pp_send or sample) with the probe's sequence numbers. `hung_job` plants one
culprit in the last step and leaves every other rank waiting on it, as an
engine's ranks would. `write_run_dir` writes such a snapshot as a run dir
through runfile's own writer; synth_fr.py writes Flight Recorder dumps of such a job.

Liveness. The probe files name this process (pid, create time, this host), as
a probe names the rank that writes it. While it runs, the collector finds the
ranks alive; `SynthRun.beat` moves their heartbeats the way the probe's
heartbeat thread does in a hung job (in a hang nothing else moves). Once the
process is gone the files are those of a job that has ended, and the analysis
judges the hang as it stood before, as after a real run: the ranks wait (their
heartbeat is just old), and none reads as dead, since no verdict calls the
end a death (report.rank_rows).
"""
from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields

import psutil

from diagnose.core import runfile
from diagnose.core.groups import encode as encode_groups
from diagnose.core.layout import Layout, tp_group_name
from diagnose.core.snapshot import (CollectiveRecord, FaultRecord, Identity, PhaseEvent, RankState,
                                    Snapshot, WorkerExit)
from diagnose.core.vocab import STARTUP_PHASES, Op, Phase, Role, VerdictKind

OP_S = 0.01        # one traced op, when nothing waits
SHAPE = [4, 64]
KINDS = (VerdictKind.NEVER_REACHED, VerdictKind.STUCK_IN_PHASE, VerdictKind.COLLECTIVE_MISSING_PEERS)
HANG_S = 30.0      # how long before the snapshot the culprit stopped
PIPE_S = 2.0       # the longest pass of a step through the stages: deeper pipelines get
                   # shorter ops, so that the hung step (stage k begins 4 ops after
                   # stage k-1) ends before the snapshot whatever the depth
FR_DIR = "fr"      # where `diag synth --fr-dumps` puts the dumps, inside OUT


class SynthError(ValueError):
    """A job that cannot be laid out: the message says why."""


class Job:
    def __init__(self, tp: int = 2, pp: int = 4, now: float = 1000.0, layers: int = 1,
                 op_s: float = OP_S):
        self.tp, self.pp, self.now, self.op_s = tp, pp, now, op_s
        self.allreduces = 2 * layers          # per forward: after attention and after the MLP
        self.layout = Layout(tp, pp)
        every = list(range(tp * pp))          # one list, shared by every rank's identity
        self.groups = {tp_group_name(p): self.layout.tp_ranks(p) for p in range(pp)} | {"pp": every}
        self.ranks = {rank: self._state(rank) for rank in range(tp * pp)}
        self.driver = self._driver()
        self.seqs: dict[tuple, int] = {}
        self.command_exit: int | None = None

    def _state(self, rank: int) -> RankState:
        identity = Identity(role=Role.WORKER, rank=rank, world_size=self.tp * self.pp,
                            tp_rank=rank % self.tp, tp_size=self.tp, pp_rank=rank // self.tp,
                            pp_size=self.pp, host="host", pid=1000 + rank, device="cpu",
                            groups={name: self.groups[name]      # its own, as a probe's
                                    for name in (tp_group_name(rank // self.tp), "pp")})
        return RankState(identity=identity, started_at=0.0, heartbeat_at=self.now - 0.05,
                         alive=True, open_phases=[], frame="engine/worker.py:120 busy_loop",
                         phases=[], collectives=[])

    def _driver(self) -> RankState:
        identity = Identity(role=Role.DRIVER, rank=None, world_size=self.tp * self.pp, tp_rank=None,
                            tp_size=self.tp, pp_rank=None, pp_size=self.pp, host="host",
                            pid=999, device="cpu")
        return RankState(identity=identity, started_at=0.0, heartbeat_at=self.now - 0.05,
                         alive=True, open_phases=[], frame="engine/engine_core.py:60 step",
                         phases=[], collectives=[])

    def snapshot(self) -> Snapshot:
        for state in list(self.ranks.values()) + [self.driver]:
            if state.alive:
                state.heartbeat_at = self.now - 0.05
        return Snapshot(taken_at=self.now, run_dir="synthetic", ranks=self.ranks,
                        driver=self.driver, command_exit=self.command_exit)

    # What the probe writes.

    def phase(self, state: RankState, name: str, start: float, end: float | None = None,
              step: int | None = None) -> PhaseEvent:
        event = PhaseEvent(name, step, start, end)
        state.phases.append(event)
        if end is None:
            state.open_phases.append(event)
        return event

    def record(self, rank: int, group: str, op: str, start: float, end: float | None,
               peer: int | None = None, shape=SHAPE, dtype: str = "float32") -> CollectiveRecord:
        key = (rank, group, op, peer) if peer is not None else (rank, group)
        seq = self.seqs.get(key, 0)
        self.seqs[key] = seq + 1
        record = CollectiveRecord(group=group, seq=seq, op=op, peer=peer, shapes=[list(shape)],
                                  dtype=dtype, nbytes=4 * shape[0] * shape[1],
                                  site="engine/layers.py:80 forward",
                                  state="enqueued" if end is None else "completed",
                                  t_enqueue=start, t_complete=end)
        self.ranks[rank].collectives.append(record)
        return record

    def startup(self, rank: int, start: float, seconds: float = 1.0,
                stop_in: str | None = None) -> float:
        """The start-up phases, each `seconds` long; stop_in leaves that one open."""
        state, t = self.ranks[rank], start
        for name in STARTUP_PHASES:
            if name == stop_in:
                self.phase(state, name, t)
                return t
            self.phase(state, name, t, t + seconds)
            t += seconds
        return t

    def dequeue(self, rank: int, start: float, end: float | None = None) -> None:
        """Like the engine's, the phase carries the step the rank expects next."""
        state = self.ranks[rank]
        done = [event.step for event in state.phases
                if event.name == Phase.EXECUTE_MODEL and event.end is not None]
        self.phase(state, Phase.DEQUEUE, start, end, max(done) + 1 if done else 0)

    def step(self, rank: int, step: int, start: float, stop: str | None = None,
             recv_wait: float = 0.0, work_s: float | None = None,
             allreduce_wait: float = 0.0) -> float:
        """One execute_model of a worker, starting with its dequeue. `stop` leaves it
        blocked: "pp_recv", "in_forward" (inside forward, before its first
        all_reduce), "forward" (in the first all_reduce), "forward_second" (in the
        second), "forward_last" (in the last), "forward_entry", "pp_send",
        "pp_send_entry"; "skip_allreduce" skips the first all_reduce and goes on.
        Returns the time the step ended (or stopped)."""
        state = self.ranks[rank]
        pp_rank, tp_rank = divmod(rank, self.tp)
        self.dequeue(rank, start, start + self.op_s)
        state.ring_read += 1
        t = start + self.op_s
        outer = self.phase(state, Phase.EXECUTE_MODEL, t, None, step)
        t += self.op_s if work_s is None else work_s
        if pp_rank > 0:
            prev = rank - self.tp
            if stop == "pp_recv":
                self.phase(state, "pp_recv", t)
                self.record(rank, "pp", Op.RECV, t, None, peer=prev)
                return t
            self.phase(state, "pp_recv", t, t + self.op_s + recv_wait)
            self.record(rank, "pp", Op.RECV, t, t + self.op_s + recv_wait, peer=prev)
            t += self.op_s + recv_wait
        if stop == "forward_entry":
            return t
        forward = self.phase(state, "forward", t, None)
        if stop == "in_forward":
            return t
        last = self.allreduces - 1
        for index in range(self.allreduces):
            if (stop, index) in (("forward", 0), ("forward_second", 1), ("forward_last", last)):
                self.record(rank, tp_group_name(pp_rank), Op.ALL_REDUCE, t, None)
                return t
            if stop == "skip_allreduce" and index == 0:
                continue
            wait = allreduce_wait if index == 0 else 0.0
            self.record(rank, tp_group_name(pp_rank), Op.ALL_REDUCE, t, t + self.op_s + wait)
            t += self.op_s + wait
        self._close(state, forward, t)
        if stop == "pp_send_entry":
            return t
        if pp_rank < self.pp - 1:
            nxt = rank + self.tp
            if stop == "pp_send":
                self.phase(state, "pp_send", t)
                self.record(rank, "pp", Op.SEND, t, None, peer=nxt)
                return t
            self.phase(state, "pp_send", t, t + self.op_s)
            self.record(rank, "pp", Op.SEND, t, t + self.op_s, peer=nxt)
            t += self.op_s
        else:
            self.phase(state, "sample", t, t + self.op_s)
            t += self.op_s
        self._close(state, outer, t)
        return t

    def _close(self, state: RankState, event: PhaseEvent, end: float) -> None:
        event.end = end
        state.open_phases.remove(event)

    def driver_step(self, step: int, start: float, end: float | None) -> None:
        """schedule, then execute_model (open until the result came back)."""
        self.driver.ring_written += 1
        self.phase(self.driver, "schedule", start, start + self.op_s)
        self.phase(self.driver, Phase.EXECUTE_MODEL, start + self.op_s, end, step)
        if end is not None:
            self.phase(self.driver, "update_from_output", end, end + self.op_s)

    def stage_start(self, rank: int, t: float) -> float:
        """When the rank's stage begins a step the driver sent at t."""
        return t + self.op_s + (rank // self.tp) * 4 * self.op_s

    def healthy(self, steps: int, start: float, step_s: float = 0.1) -> float:
        """`steps` steps of the whole job, one after another; returns when they end."""
        t = start
        for step in range(steps):
            self.driver_step(step, t, t + step_s)
            for rank in self.ranks:
                self.step(rank, step, self.stage_start(rank, t))
            t += step_s + 2 * self.op_s
        return t

    def everyone_started(self, start: float = 10.0, seconds: float = 1.0) -> float:
        for rank in self.ranks:
            end = self.startup(rank, start, seconds)
        return end

    def died(self, rank: int, at: float, exitcode: int) -> None:
        self.ranks[rank].alive = False
        self.ranks[rank].heartbeat_at = at
        self.driver.worker_exits.append(WorkerExit(rank, exitcode, at))

    def fault(self, rank: int, spec: str, fired_at: float) -> None:
        self.ranks[rank].fault = FaultRecord(spec, fired_at)


# A hung job.

def check_layout(ranks: int, tp: int, culprit: int) -> int:
    """The number of PP stages, or SynthError."""
    if ranks < 2 or tp < 1:
        raise SynthError(f"need at least 2 ranks and tp >= 1, not ranks={ranks} tp={tp}")
    if ranks % tp:
        raise SynthError(f"--ranks {ranks} is not a multiple of --tp {tp}")
    if not 0 <= culprit < ranks:
        raise SynthError(f"--culprit {culprit} is not a rank of 0..{ranks - 1}")
    return ranks // tp


def records_per_step(tp: int, pp: int, layers: int, rank: int) -> int:
    """Collective records one step of Job.step leaves on `rank`: two all_reduces
    a layer, a recv unless first stage, a send unless last."""
    stage = rank // tp
    return 2 * layers + (stage > 0) + (stage < pp - 1)


def hung_job(ranks: int, tp: int, culprit: int, kind: str, steps: int = 20, layers: int = 1,
             now: float | None = None, hang_s: float = HANG_S) -> Job:
    """`steps` healthy steps, then in the next one `culprit` stops (kind):

    never_reached             it took the message of the first step and never
                              entered execute_model (no healthy steps before);
    stuck_in_phase            it sits in forward, before its first all_reduce;
    collective_missing_peers  it skipped a TP all_reduce, finished the step and
                              waits for the next; its TP peers block in the last one.

    Everyone else does what an engine's ranks do then: its TP peers block in an
    all_reduce without it, later stages in pp_recv (or, after a skip, in an
    all_reduce with a peer that waits there), earlier stages finish the step and
    wait in dequeue, the driver waits in execute_model. The culprit stopped
    about `hang_s` before `now`."""
    if kind not in KINDS:
        raise SynthError(f"--kind {kind!r}: one of {', '.join(KINDS)}")
    pp = check_layout(ranks, tp, culprit)
    if kind == VerdictKind.COLLECTIVE_MISSING_PEERS and tp < 2:
        raise SynthError("collective_missing_peers plants a skipped TP all_reduce: "
                         "it needs --tp 2 or more")
    if kind == VerdictKind.NEVER_REACHED:
        steps = 0
    now = time.time() if now is None else now
    job = Job(tp, pp, now=now, layers=layers, op_s=min(OP_S, PIPE_S / (4 * pp)))
    step_s = job.op_s * (job.allreduces + 8) + job.stage_start(ranks - 1, 0.0)  # the last stage's too
    # A second, the start-up phases (a second each), the steps, then the hang.
    started_at = now - hang_s - steps * (step_s + 2 * job.op_s) - len(STARTUP_PHASES) - 1.0
    for state in list(job.ranks.values()) + [job.driver]:
        state.started_at = started_at
    t_hang = job.healthy(steps, job.everyone_started(started_at + 1.0), step_s)
    job.driver_step(steps, t_hang, None)
    hang_step(job, list(job.ranks), steps, t_hang, culprit, kind)
    return job


def hang_step(job: Job, ranks: list[int], step: int, t_hang: float, culprit: int,
              kind: str) -> None:
    """Step `step`, sent at t_hang, of `ranks`: `culprit` stops (kind) and every
    other rank does what hung_job says."""
    stage, lane = divmod(culprit, job.tp)
    for rank in ranks:
        start = job.stage_start(rank, t_hang)
        rank_stage, rank_lane = divmod(rank, job.tp)
        if rank == culprit:
            _stop_culprit(job, rank, step, start, kind)
        elif rank_stage == stage:
            job.step(rank, step, start,
                     stop="forward_last" if kind == VerdictKind.COLLECTIVE_MISSING_PEERS else "forward")
        elif rank_stage < stage:
            job.dequeue(rank, job.step(rank, step, start))
        elif kind == VerdictKind.COLLECTIVE_MISSING_PEERS and rank_stage == stage + 1 and rank_lane == lane:
            job.step(rank, step, start, stop="forward")   # the culprit's send reached it
        else:
            job.step(rank, step, start, stop="pp_recv")


def _stop_culprit(job: Job, rank: int, step: int, start: float, kind: str) -> None:
    if kind == VerdictKind.NEVER_REACHED:
        job.dequeue(rank, start, start + job.op_s)
        job.ranks[rank].ring_read += 1
        job.ranks[rank].frame = "engine/worker.py:131 execute_model"
    elif kind == VerdictKind.STUCK_IN_PHASE:
        job.step(rank, step, start, stop="in_forward")
        job.ranks[rank].frame = "engine/layers.py:190 forward"
    else:
        job.dequeue(rank, job.step(rank, step, start, stop="skip_allreduce"))
        job.ranks[rank].frame = "engine/shm_ring.py:37 wait"


# The run dir.

@dataclass
class SynthRun:
    run_dir: str
    files: list[tuple[runfile.RunFileWriter, str]]   # every probe file, with its frame

    def beat(self, count: int) -> None:
        """One beat of every rank's heartbeat thread (count starts above 1)."""
        now = time.time()
        for writer, frame in self.files:
            writer.heartbeat(now, count, frame)

    def beat_forever(self) -> None:
        count = 2
        while True:
            self.beat(count)
            count += 1
            time.sleep(runfile.HEARTBEAT_S)


def write_run_dir(snapshot: Snapshot, run_dir: str) -> SynthRun:
    """Each rank of `snapshot` (and its driver) as a probe file in `run_dir`,
    written by this process, through runfile's writer."""
    os.makedirs(run_dir, exist_ok=True)
    create_time = psutil.Process().create_time()
    states = [(rank, state) for rank, state in snapshot.ranks.items()]
    if snapshot.driver is not None:
        states.append((None, snapshot.driver))
    files, encoded = [], {}
    for rank, state in states:
        path = os.path.join(run_dir, runfile.probe_file_name(rank))
        identity = _identity_fields(state.identity, encoded)
        files.append((_write_probe(path, state, identity, create_time), state.frame))
    run = SynthRun(run_dir, files)
    run.beat(1)
    return run


def _identity_fields(identity: Identity, encoded: dict[int, str]) -> dict:
    """The identity as the probe writes it, naming this process; each members
    list encoded once (`encoded`, by the list's id): ranks share their groups."""
    fields = {field.name: getattr(identity, field.name) for field in dataclass_fields(identity)}
    groups = {}
    for name, members in identity.groups.items():
        if id(members) not in encoded:
            encoded[id(members)] = encode_groups({name: members})[name]
        groups[name] = encoded[id(members)]
    return fields | {"host": socket.gethostname(), "pid": os.getpid(), "groups": groups}


def _write_probe(path: str, state: RankState, identity: dict,
                 create_time: float) -> runfile.RunFileWriter:
    pid = identity["pid"]
    writer = runfile.RunFileWriter(path, identity, pid, create_time, state.started_at)
    _replay_phases(writer, state.phases)
    for record in state.collectives:
        at = writer.open_collective(
            record.group, record.seq, record.op, record.peer,
            runfile.format_shapes(record.shapes), record.dtype.encode(), record.nbytes,
            record.site.encode(), record.t_enqueue, record.device)
        if record.t_complete is not None:
            writer.complete_collective(at, record.t_complete)
    writer.ring_read(state.ring_read)
    writer.ring_written(state.ring_written)
    if state.fault is not None:
        writer.fault(state.fault.spec, state.fault.fired_at or 0.0)
    for exit in state.worker_exits:
        writer.worker_exit(exit.rank, exit.exitcode, exit.at)
    return writer


def _replay_phases(writer: runfile.RunFileWriter, phases: list[PhaseEvent]) -> None:
    """Enters and leaves the phases in time order, as the rank did: at one
    instant a phase ends before the next begins, inner ends before outer."""
    moves = []
    for index, event in enumerate(phases):
        moves.append((event.start, 1, index))
        if event.end is not None:
            moves.append((event.end, 0, -index))
    numbers, depth = {}, 0
    for _, enter, index in sorted(moves):
        if enter:
            depth += 1
            event = phases[index]
            numbers[index] = writer.open_phase(event.name, event.step, event.start, depth)
        else:
            depth -= 1
            writer.close_phase(numbers[-index], phases[-index].end, depth)


# Flight Recorder dumps.

