"""The TUI over synthetic snapshots of a tp=2 pp=4 run (rank 6 stuck before
execute_model, and no fault), with the verdicts of the real analysis, and what
a Pilot test reads off its screen."""
from __future__ import annotations

import time
from dataclasses import replace

from diagnose.analysis import analyze
from diagnose.core.snapshot import Judged, Snapshot
from helpers.synthetic import OP_S, Job

TP, PP = 2, 4
SIZE = (120, 40)


# -- synthetic runs (tests/helpers/synthetic.py plays the probe; the verdicts come from the real analysis)

def settle(job: Job, now: float) -> Snapshot:
    job.now = now
    for state in [*job.ranks.values(), job.driver]:
        state.heartbeat_at = now - 0.05
    return job.snapshot()


def rank6_never_reached(run_dir: str = "/runs/rank6-never-reached") -> Snapshot:
    """Step 0: ranks 0-5 finished it and wait for the next broadcast, rank 6 read the
    broadcast but hangs on entering execute_model, rank 7 waits in its TP all_reduce."""
    job = Job(TP, PP)
    t = job.everyone_started(start=0.0, seconds=1.0)
    job.driver_step(0, t, None)
    for rank in job.ranks:
        start = t + OP_S + (rank // TP) * 4 * OP_S
        if rank == 6:
            job.dequeue(6, start, start + OP_S)
            job.ranks[6].ring_read += 1
            job.fault(6, "rank=6 phase=execute_model kind=hang", start + OP_S)
            job.ranks[6].frame = "diagnose/faults.py:170 block_forever"
            job.ranks[6].stacks = {
                "MainThread": ["engine/worker.py:120 busy_loop", "diagnose/probe.py:77 phase",
                               "diagnose/faults.py:170 block_forever"],
                "diag-heartbeat": ["diagnose/probe.py:210 beat"]}
        elif rank == 7:
            job.step(7, 0, start, stop="forward")
            job.ranks[7].frame = "engine/communicator.py:52 all_reduce"
        else:
            job.dequeue(rank, job.step(rank, 0, start))
    return replace(settle(job, t + 36.0), run_dir=run_dir)


def no_fault(run_dir: str = "/runs/no-fault") -> Snapshot:
    """Mid-way through step 20 of a healthy run: stages 0-2 done, stage 3 in its all_reduce."""
    job = Job(TP, PP)
    t = job.healthy(steps=20, start=job.everyone_started(start=0.0, seconds=1.0))
    job.driver_step(20, t, None)
    for rank in job.ranks:
        start = t + OP_S + (rank // TP) * 4 * OP_S
        if rank // TP == PP - 1:
            job.step(rank, 20, start, stop="forward")
        else:
            job.dequeue(rank, job.step(rank, 20, start))
    return replace(settle(job, t + 0.2), run_dir=run_dir)


class SyntheticSource:
    """Serves the same snapshot on every poll, as a finished run dir would, and
    its verdicts from the real analysis."""
    live = True

    def __init__(self, snapshot: Snapshot, command: list[str] | None = None) -> None:
        self.fixed = snapshot
        self.run_dir = snapshot.run_dir
        self.launched = command

    def snapshot(self) -> Snapshot:
        return self.fixed

    def command(self) -> list[str] | None:
        return self.launched

    def judged(self) -> Judged:
        snapshot = self.snapshot()
        return Judged(snapshot, tuple(analyze(snapshot)))

    def launcher_judgment(self) -> None:
        return None          # no diag launch wrote one


class RecordingController:
    """A test double for the controller `diag launch` passes: records what the TUI asks."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []
        self.blocking: set[int] = set()

    def toggle_launch_blocking(self, rank: int) -> bool:
        self.calls.append(("toggle_launch_blocking", rank))
        self.blocking ^= {rank}
        return rank in self.blocking

    def restart(self) -> None:
        self.calls.append(("restart",))

    def stop(self) -> None:
        self.calls.append(("stop",))


def offered(app) -> set[str]:
    """The keys the footer offers: shown, and able to act now."""
    return {active.binding.description for active in app.screen.active_bindings.values()
            if active.enabled and active.binding.show}


def screen_text(app) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


async def started(app, pilot) -> None:
    """Wait until the first poll has reached the screen."""
    while app.snapshot is None:
        await pilot.pause(0.02)
    await pilot.pause()


async def until(pilot, condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the screen never showed it"
        await pilot.pause(0.05)
