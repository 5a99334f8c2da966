"""Every call between ranks goes through here, so the probe sees each one.

Rank layout as in vLLM: rank = pp_rank * tp_size + tp_rank. Each PP stage has
its own TP group; stages talk to their neighbours with send/recv on the world
group. gloo on CPU, NCCL on GPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from diagnose import probe


@dataclass(frozen=True)
class Layout:
    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, pp_rank: int, tp_rank: int) -> int:
        return pp_rank * self.tp_size + tp_rank

    def tp_ranks(self, pp_rank: int) -> list[int]:
        return [self.rank(pp_rank, t) for t in range(self.tp_size)]

    def groups(self) -> dict[str, list[int]]:
        groups = {f"tp{p}": self.tp_ranks(p) for p in range(self.pp_size)}
        groups["pp"] = list(range(self.world_size))
        return groups


class Communicator:
    """One rank's view of the job. With world size 1 nothing is initialised."""

    def __init__(self, layout: Layout, rank: int, init_method: str | None = None,
                 backend: str = "gloo", timeout_s: float = 1800.0):
        self.layout = layout
        self.rank = rank
        self.tp_rank = rank % layout.tp_size
        self.pp_rank = rank // layout.tp_size
        self.tp_group_name = f"tp{self.pp_rank}"
        self._tp_group = None
        if layout.world_size > 1:
            self._init(init_method, backend, timeout_s)

    def _init(self, init_method, backend, timeout_s):
        import datetime
        dist.init_process_group(backend, init_method=init_method, rank=self.rank,
                                world_size=self.layout.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
        # Every rank must create every group, in the same order.
        for p in range(self.layout.pp_size):
            group = dist.new_group(self.layout.tp_ranks(p))
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
        with probe.collective(self.tp_group_name, "all_reduce", [tensor]) as record:
            if not record.skip:
                dist.all_reduce(tensor, group=self._tp_group)
        return tensor

    def all_gather(self, tensor: torch.Tensor, dim: int = -1) -> torch.Tensor:
        if self.tp_size == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.tp_size)]
        with probe.collective(self.tp_group_name, "all_gather", [tensor]) as record:
            if not record.skip:
                dist.all_gather(parts, tensor.contiguous(), group=self._tp_group)
        return torch.cat(parts, dim=dim)

    def send(self, tensors: list[torch.Tensor], dst: int) -> None:
        for tensor in tensors:
            with probe.collective("pp", "send", [tensor], peer=dst) as record:
                if not record.skip:
                    dist.send(tensor.contiguous(), dst)

    def recv(self, like: list[tuple[tuple[int, ...], torch.dtype]], src: int,
             device: torch.device | str = "cpu") -> list[torch.Tensor]:
        tensors = []
        for shape, dtype in like:
            tensor = torch.empty(shape, dtype=dtype, device=device)
            with probe.collective("pp", "recv", [tensor], peer=src) as record:
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
