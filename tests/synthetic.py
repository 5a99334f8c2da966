"""Hand-built snapshots of a TP x PP job, for the analysis tests.

`Job` holds one RankState per worker and one for the driver and writes into
them what the probe would: phases (open ones also in open_phases) and
collective records with the probe's sequence numbers (per group; per
(group, op, peer) for send/recv). `Job.step` plays one worker's engine step
with the probe's phase layout and can leave it blocked at a chosen point.
"""
from __future__ import annotations

from diagnose.snapshot import (CollectiveRecord, FaultRecord, Identity, PhaseEvent, RankState,
                               Snapshot, STARTUP_PHASES, WorkerExit)

OP_S = 0.01        # one traced op, when nothing waits
SHAPE = [4, 64]


class Job:
    def __init__(self, tp: int = 2, pp: int = 4, now: float = 1000.0):
        self.tp, self.pp, self.now = tp, pp, now
        self.groups = {f"tp{p}": [p * tp + t for t in range(tp)] for p in range(pp)}
        self.groups["pp"] = list(range(tp * pp))
        self.ranks = {rank: self._state(rank) for rank in range(tp * pp)}
        self.driver = self._driver()
        self.seqs: dict[tuple, int] = {}
        self.command_exit: int | None = None

    def _state(self, rank: int) -> RankState:
        identity = Identity(role="worker", rank=rank, world_size=self.tp * self.pp,
                            tp_rank=rank % self.tp, tp_size=self.tp, pp_rank=rank // self.tp,
                            pp_size=self.pp, host="host", pid=1000 + rank, device="cpu",
                            groups=self.groups)
        return RankState(identity=identity, started_at=0.0, heartbeat_at=self.now - 0.05,
                         alive=True, open_phases=[], frame="engine/worker.py:120 busy_loop",
                         phases=[], collectives=[])

    def _driver(self) -> RankState:
        identity = Identity(role="driver", rank=None, world_size=self.tp * self.pp, tp_rank=None,
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
                if event.name == "execute_model" and event.end is not None]
        self.phase(state, "dequeue", start, end, max(done) + 1 if done else 0)

    def step(self, rank: int, step: int, start: float, stop: str | None = None,
             recv_wait: float = 0.0, work_s: float = OP_S, allreduce_wait: float = 0.0) -> float:
        """One execute_model of a worker, starting with its dequeue. `stop` leaves it
        blocked: "pp_recv", "forward" (in the first all_reduce), "forward_second"
        (in the second), "forward_entry", "pp_send", "pp_send_entry";
        "skip_allreduce" skips the first all_reduce and goes on. Returns the time the step ended (or stopped)."""
        state = self.ranks[rank]
        pp_rank, tp_rank = divmod(rank, self.tp)
        self.dequeue(rank, start, start + OP_S)
        state.ring_read += 1
        t = start + OP_S
        outer = self.phase(state, "execute_model", t, None, step)
        t += work_s
        if pp_rank > 0:
            prev = rank - self.tp
            if stop == "pp_recv":
                self.phase(state, "pp_recv", t)
                self.record(rank, "pp", "recv", t, None, peer=prev)
                return t
            self.phase(state, "pp_recv", t, t + OP_S + recv_wait)
            self.record(rank, "pp", "recv", t, t + OP_S + recv_wait, peer=prev)
            t += OP_S + recv_wait
        if stop == "forward_entry":
            return t
        forward = self.phase(state, "forward", t, None)
        for index in range(2):
            if (stop, index) in (("forward", 0), ("forward_second", 1)):
                self.record(rank, f"tp{pp_rank}", "all_reduce", t, None)
                return t
            if stop == "skip_allreduce" and index == 0:
                continue
            wait = allreduce_wait if index == 0 else 0.0
            self.record(rank, f"tp{pp_rank}", "all_reduce", t, t + OP_S + wait)
            t += OP_S + wait
        self._close(state, forward, t)
        if stop == "pp_send_entry":
            return t
        if pp_rank < self.pp - 1:
            nxt = rank + self.tp
            if stop == "pp_send":
                self.phase(state, "pp_send", t)
                self.record(rank, "pp", "send", t, None, peer=nxt)
                return t
            self.phase(state, "pp_send", t, t + OP_S)
            self.record(rank, "pp", "send", t, t + OP_S, peer=nxt)
            t += OP_S
        else:
            self.phase(state, "sample", t, t + OP_S)
            t += OP_S
        self._close(state, outer, t)
        return t

    def _close(self, state: RankState, event: PhaseEvent, end: float) -> None:
        event.end = end
        state.open_phases.remove(event)

    def driver_step(self, step: int, start: float, end: float | None) -> None:
        """schedule, then execute_model (open until the result came back)."""
        self.driver.ring_written += 1
        self.phase(self.driver, "schedule", start, start + OP_S)
        self.phase(self.driver, "execute_model", start + OP_S, end, step)
        if end is not None:
            self.phase(self.driver, "update_from_output", end, end + OP_S)

    def healthy(self, steps: int, start: float, step_s: float = 0.1) -> float:
        """`steps` steps of the whole job, one after another; returns when they end."""
        t = start
        for step in range(steps):
            self.driver_step(step, t, t + step_s)
            for rank in self.ranks:
                stage_start = t + OP_S + (rank // self.tp) * 4 * OP_S
                self.step(rank, step, stage_start)
            t += step_s + 2 * OP_S
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
