"""The worker processes of one node: spawned here, fed through one shared-memory
ring that every one of them reads, answering on one pipe each.

The head's Executor and a headless node's relay (node.py) both run their
ranks through this class. Waiting callers include `waitables()` in their
`wait`, so a worker that dies is noticed within a poll interval, never a hang.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import time

import torch

from diagnose.core.layout import Layout
from engine.config import EngineConfig
from engine.errors import EngineError
from engine.worker.shm_ring import ShmRing
from engine.worker.worker import WorkerArgs, worker_main

POLL_S = 0.5
STOP_GRACE_S = 5.0   # a clean stop: workers finish what they are doing
DEAD_GRACE_S = 1.0   # after a death: the others may be stuck waiting on the dead one


class WorkerDiedError(EngineError):
    """A worker process (or a whole node) ended while the engine needed it."""

    def __init__(self, message: str, rank: int | None = None, exitcode: int | None = None):
        super().__init__(message)
        self.rank = rank
        self.exitcode = exitcode


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


class LocalWorkers:
    def __init__(self, config: EngineConfig, device: str, dtype: torch.dtype, ranks: range,
                 init_method: str):
        self.layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.ranks = ranks
        self.ring = ShmRing.create(n_readers=len(ranks))
        self.procs, self.conns = [], []
        try:
            self._spawn(config, device, dtype, init_method)
        except BaseException:
            self.shutdown(STOP_GRACE_S)  # the ring and any worker already started go too
            raise

    def _spawn(self, config: EngineConfig, device: str, dtype: torch.dtype, init_method: str) -> None:
        ctx = mp.get_context("spawn")
        for local_rank, rank in enumerate(self.ranks):
            args = WorkerArgs(config, rank, local_rank, init_method, self.ring.handle, device, dtype,
                              parent_pid=mp.current_process().pid)
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(args, writer), daemon=True,
                               name=f"engine-rank-{rank}")
            proc.start()
            writer.close()
            self.procs.append(proc)
            self.conns.append(reader)

    def submit(self, message: tuple, should_abort) -> int:
        """Broadcast (method, args, output_rank); returns the messages written so far."""
        return self.ring.enqueue(message, should_abort=should_abort)

    def waitables(self) -> list:
        """What to pass to multiprocessing.connection.wait: reply pipes and process sentinels."""
        return self.conns + [proc.sentinel for proc in self.procs]

    def take_replies(self) -> list[tuple[int, object]]:
        """Every reply already waiting, as (rank, reply); each rank's in the order sent."""
        replies = []
        for rank, proc, conn in zip(self.ranks, self.procs, self.conns):
            while conn.poll():
                try:
                    replies.append((rank, conn.recv()))
                except EOFError:  # the worker closed its pipe: it is exiting
                    proc.join(timeout=POLL_S)
                    self.check()
                    raise WorkerDiedError(f"{self.layout.name(rank)} closed its reply pipe",
                                          rank) from None
        return replies

    def check(self) -> None:
        """Raise WorkerDiedError naming the first dead worker."""
        for rank, proc in zip(self.ranks, self.procs):
            if proc.exitcode is not None:
                raise WorkerDiedError(
                    f"{self.layout.name(rank)} {describe_exit(proc.exitcode)}",
                    rank, proc.exitcode)

    def shutdown(self, grace_s: float) -> None:
        """Workers leave their loop when the ring closes; a worker stuck elsewhere
        (in a collective with a dead peer, say) is killed after grace_s."""
        if self.ring is None:
            return
        self.ring.close()
        deadline = time.monotonic() + grace_s
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for conn in self.conns:
            conn.close()
        self.ring.release()
        self.ring = None
