"""Spawns the TP x PP worker processes and talks to them only through collective_rpc.

Requests go out through the shared-memory ring (every worker reads every
message); replies come back on one pipe per worker. While waiting, the
executor watches every worker's process sentinel, so a dead worker is an
error within a poll interval, never a hang.
"""
from __future__ import annotations

import multiprocessing as mp
import signal
import socket
import time
from multiprocessing.connection import wait

import torch

from diagnose import probe
from engine.communicator import Layout
from engine.config import EngineConfig
from engine.shm_ring import ShmRing
from engine.worker import WorkerArgs, worker_main

POLL_S = 0.5


class WorkerDiedError(RuntimeError):
    """A worker process ended while the engine needed it."""


def describe_exit(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Executor:
    def __init__(self, config: EngineConfig, device: str, dtype: torch.dtype):
        self.layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.output_rank = self.layout.rank(self.layout.pp_size - 1, 0)
        self.ring = ShmRing.create(n_readers=self.layout.world_size)
        self.dead: WorkerDiedError | None = None
        self.procs, self.conns = [], []
        try:
            self._spawn_workers(config, device, dtype)
        except BaseException:
            self.shutdown()  # the ring and any worker already started go too
            raise

    def _spawn_workers(self, config: EngineConfig, device: str, dtype: torch.dtype) -> None:
        ctx = mp.get_context("spawn")
        init_method = f"tcp://127.0.0.1:{_free_port()}"
        for rank in range(self.layout.world_size):
            args = WorkerArgs(config, rank, init_method, self.ring.handle, device, dtype,
                              parent_pid=mp.current_process().pid)
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=worker_main, args=(args, writer), daemon=True,
                               name=f"engine-rank-{rank}")
            proc.start()
            writer.close()
            self.procs.append(proc)
            self.conns.append(reader)

    # -- talking to workers ----------------------------------------------
    def collective_rpc(self, method: str, args: tuple = (), output_rank: int | None = None):
        """Run method on every worker; return the replies of output_rank, or of all ranks."""
        self.submit(method, args, output_rank)
        ranks = [output_rank] if output_rank is not None else range(self.layout.world_size)
        return [self.wait_reply(rank) for rank in ranks]

    def submit(self, method: str, args: tuple = (), output_rank: int | None = None) -> None:
        self.check_workers()
        written = self.ring.enqueue((method, args, output_rank), should_abort=self.check_workers)
        probe.ring_state(written)

    def wait_reply(self, rank: int):
        conn = self.conns[rank]
        while not conn.poll():
            wait([conn] + [p.sentinel for p in self.procs], timeout=POLL_S)
            if not conn.poll():
                self.check_workers()
        try:
            return conn.recv()
        except EOFError:  # the worker closed its pipe: it is exiting
            self.procs[rank].join(timeout=POLL_S)
            self.check_workers()
            raise WorkerDiedError(f"rank {rank} closed its reply pipe")

    def execute_model(self, scheduler_output):
        self.submit("execute_model", (scheduler_output,), self.output_rank)
        return self.wait_reply(self.output_rank)

    # -- health and lifetime ----------------------------------------------
    def check_workers(self) -> None:
        """Raise WorkerDiedError naming the first dead worker."""
        if self.dead:
            raise self.dead
        for rank, proc in enumerate(self.procs):
            if proc.exitcode is not None:
                probe.worker_exit(rank, proc.exitcode)
                tp, pp = rank % self.layout.tp_size, rank // self.layout.tp_size
                self.dead = WorkerDiedError(
                    f"rank {rank} (pp {pp}/{self.layout.pp_size}, tp {tp}) "
                    f"{describe_exit(proc.exitcode)}")
                raise self.dead

    def shutdown(self) -> None:
        if self.ring is None:
            return
        with probe.phase("shutdown"):
            self._stop_workers()

    def _stop_workers(self) -> None:
        """Workers leave their loop when the ring closes; a worker stuck elsewhere
        (in a collective with a dead peer, say) is killed after a grace period."""
        self.ring.close()
        deadline = time.monotonic() + (1.0 if self.dead else 5.0)
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
