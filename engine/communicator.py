"""Every call between ranks goes through here, so the probe sees each one.

Rank layout as in vLLM: rank = pp_rank * tp_size + tp_rank. Each PP stage has
its own TP group; stages talk to their neighbours with send/recv on the world
group. gloo on CPU, NCCL on GPU.
"""
from __future__ import annotations

import os
import socket
import urllib.parse

import torch
import torch.distributed as dist

from diagnose import probe
from diagnose.core.layout import Layout, tp_group_name
from diagnose.core.vocab import Op

TIMEOUT_VAR = "ENGINE_DIST_TIMEOUT_S"   # the process groups' timeout, e.g. 20 to see NCCL's watchdog fire
DEFAULT_TIMEOUT_S = 1800.0


def timeout_from_env() -> float:
    text = os.environ.get(TIMEOUT_VAR)
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise ValueError(f"{TIMEOUT_VAR} must be seconds > 0, not {text!r}")
    return seconds


def _rendezvous(init_method: str | None, rank: int, world_size: int, timeout) -> dict:
    """init_process_group's rendezvous arguments. For tcp://HOST:PORT the TCPStore
    is made here, so that rank 0's server listens on HOST alone: torch's own
    listens on every interface, whatever HOST says."""
    url = urllib.parse.urlsplit(init_method or "")
    if url.scheme != "tcp":
        return {"init_method": init_method}
    host, port = url.hostname, url.port
    if rank != 0:
        return {"store": dist.TCPStore(host, port, world_size, False, timeout)}
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = socket.create_server((host, port), family=family)
    return {"store": dist.TCPStore(host, port, world_size, True, timeout,
                                   master_listen_fd=server.detach())}


class Communicator:
    """One rank's view of the job. With world size 1 nothing is initialised."""

    def __init__(self, layout: Layout, rank: int, init_method: str | None = None,
                 backend: str = "gloo", timeout_s: float | None = None):
        self.layout = layout
        self.rank = rank
        self.pp_rank, self.tp_rank = layout.place(rank)
        self.tp_group_name = tp_group_name(self.pp_rank)
        self._tp_group = None
        if layout.world_size > 1:
            self._init(init_method, backend, timeout_s or timeout_from_env())

    def _init(self, init_method, backend, timeout_s):
        import datetime
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=self.rank, world_size=self.layout.world_size,
                                timeout=timeout, **_rendezvous(init_method, self.rank,
                                                               self.layout.world_size, timeout))
        # Every rank must create every group, in the same order. A new group does not
        # inherit the default group's timeout: it gets the backend's own unless given.
        for p in range(self.layout.pp_size):
            group = dist.new_group(self.layout.tp_ranks(p), timeout=timeout)
            if p == self.pp_rank:
                self._tp_group = group

    @property
    def tp_size(self) -> int:
        return self.layout.tp_size

    @property
    def pp_size(self) -> int:
        return self.layout.pp_size

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pp_size - 1

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return tensor
        with probe.collective(self.tp_group_name, Op.ALL_REDUCE, [tensor]) as record:
            if not record.skip:
                dist.all_reduce(tensor, group=self._tp_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.tp_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.tp_size)]
        with probe.collective(self.tp_group_name, Op.ALL_GATHER, [tensor]) as record:
            if not record.skip:
                dist.all_gather(parts, tensor.contiguous(), group=self._tp_group)
        return torch.cat(parts, dim=dim)

    def send(self, tensors: list[torch.Tensor], dst: int) -> None:
        for tensor in tensors:
            with probe.collective("pp", Op.SEND, [tensor], peer=dst) as record:
                if not record.skip:
                    dist.send(tensor.contiguous(), dst)

    def recv(self, like: list[tuple[tuple[int, ...], torch.dtype]], src: int,
             device: torch.device | str = "cpu") -> list[torch.Tensor]:
        tensors = []
        for shape, dtype in like:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            with probe.collective("pp", Op.RECV, [tensor], peer=src) as record:
                if not record.skip:
                    dist.recv(tensor, src)
            tensors.append(tensor)
        return tensors

    def next_stage_rank(self) -> int:
        return self.layout.rank(self.pp_rank + 1, self.tp_rank)

    def prev_stage_rank(self) -> int:
        return self.layout.rank(self.pp_rank - 1, self.tp_rank)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
