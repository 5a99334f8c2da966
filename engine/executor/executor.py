"""The driver's view of all TP x PP workers, talked to only through collective_rpc.

Every message goes to every rank: into this node's shared-memory ring, and,
in a multi-node run, over each headless node's link to its relay (node.py),
which puts it into that node's ring. Replies come back on one pipe per local
worker and over the links; each rank's are kept in order until asked for.
While waiting, the executor watches every local worker's process sentinel and
every link, so a dead worker anywhere is an error within a poll interval,
never a hang.
"""
from __future__ import annotations

import dataclasses
import socket
from collections import deque
from contextlib import contextmanager
from multiprocessing.connection import wait

import torch

from diagnose import probe
from diagnose.core.layout import Layout
from diagnose.core.vocab import Phase
from engine.config import EngineConfig
from engine.executor.local_workers import DEAD_GRACE_S, POLL_S, STOP_GRACE_S, LocalWorkers, WorkerDiedError
from engine.executor.node import RemoteNode, accept_nodes, init_method


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class Executor:
    def __init__(self, config: EngineConfig, device: str, dtype: torch.dtype):
        self.layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.output_rank = self.layout.rank(self.layout.pp_size - 1, 0)
        self.replies: dict[int, deque] = {rank: deque() for rank in range(self.layout.world_size)}
        self.dead: WorkerDiedError | None = None
        self.closed = False
        self.nodes: list[RemoteNode] = []
        self.local: LocalWorkers | None = None
        if config.master_port is None:
            config = dataclasses.replace(config, master_port=_free_port(config.master_addr))
        try:
            self.nodes = accept_nodes(config, device, dtype) if config.nnodes > 1 else []
            self.local = LocalWorkers(config, device, dtype, config.node_ranks(0), init_method(config))
        except BaseException:
            self.shutdown()  # the nodes that joined, and any worker already started, go too
            raise

    @property
    def procs(self) -> list:
        """This node's worker processes."""
        return self.local.procs

    # -- talking to workers ----------------------------------------------
    def collective_rpc(self, method: str, args: tuple = (), output_rank: int | None = None):
        """Run method on every worker; return the replies of output_rank, or of all ranks."""
        self.submit(method, args, output_rank)
        ranks = [output_rank] if output_rank is not None else range(self.layout.world_size)
        return [self.wait_reply(rank) for rank in ranks]

    def submit(self, method: str, args: tuple = (), output_rank: int | None = None) -> None:
        self.check_workers()
        message = (method, args, output_rank)
        for node in self.nodes:
            node.send(message)
        written = self.local.submit(message, should_abort=self.check_workers)
        probe.ring_state(written)

    def wait_reply(self, rank: int):
        while not self.replies[rank]:
            self._collect(timeout=POLL_S)
        return self.replies[rank].popleft()

    def execute_model(self, scheduler_output):
        self.submit("execute_model", (scheduler_output,), self.output_rank)
        return self.wait_reply(self.output_rank)

    # -- health and lifetime ----------------------------------------------
    def check_workers(self) -> None:
        """Raise WorkerDiedError naming the first dead worker (or lost node)."""
        self._collect(timeout=0)

    def _collect(self, timeout: float) -> None:
        """Wait up to timeout for anything from any worker: keep replies, raise on a death."""
        with self._noting_death():
            links = [node.link for node in self.nodes]
            ready = wait(links + self.local.waitables(), timeout=timeout)
            # The links first: a remote death can make local workers fail after it.
            for node in self.nodes:
                if node.link in ready:
                    rank, reply = node.receive()
                    self.replies[rank].append(reply)
            for rank, reply in self.local.take_replies():
                self.replies[rank].append(reply)
            self.local.check()

    @contextmanager
    def _noting_death(self):
        """The first death is the error from then on."""
        if self.dead:
            raise self.dead
        try:
            yield
        except WorkerDiedError as error:
            if error.exitcode is not None:
                probe.worker_exit(error.rank, error.exitcode)
            self.dead = error
            raise

    def shutdown(self) -> None:
        if self.closed:
            return
        self.closed = True
        with probe.phase(Phase.SHUTDOWN):
            grace_s = DEAD_GRACE_S if self.dead else STOP_GRACE_S
            for node in self.nodes:
                node.close(grace_s)
            if self.local is not None:
                self.local.shutdown(grace_s)
