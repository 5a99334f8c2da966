"""Who printed what: the processes of the job and the facts of the job itself
(TP and PP sizes, the ranks that exist), as the log states them.

A vLLM worker is named for its place: Worker_TP1 (PP size 1), Worker_PP1 (TP
size 1), Worker_PP1_TP0; its global rank is pp * tp_size + tp. The TP size
comes from the log (the engine's config line, or the server's non-default
args) or, when the log never says, is assumed from the workers seen, and the
description says so.
"""
from __future__ import annotations

import ast
import re
from collections import OrderedDict
from dataclasses import dataclass, field

from diagnose.offline.logs.model import Proc
from diagnose.offline.logs.reader import Line

MAX_PROCESSES = 4096     # the table forgets the least recently seen beyond this
MAX_RANKS = 65536        # ranks remembered as existing
PLACE = re.compile(r"(?:^|_)(TP|PP)(\d+)")


@dataclass
class Job:
    tp_size: int | None = None
    pp_size: int | None = None
    sizes_from: str = ""                  # which line said so
    world_size: int | None = None
    serve_args: dict | None = None        # vllm serve's "non-default args"
    ranks: set[int] = field(default_factory=set)   # ranks the log shows to exist
    last_lines: dict[int, tuple[int, int, bytes]] = field(default_factory=dict)
    # torchrun's ranks: (file, line, the line) of the last line each printed
    max_tp: int = -1                      # the highest TP index of a worker's name

    def saw_rank(self, rank: int) -> None:
        if len(self.ranks) < MAX_RANKS:
            self.ranks.add(rank)

    def sizes(self, tp: int | None, pp: int | None, source: str) -> None:
        """Sizes from a config line; the engine's own config wins over the server's args."""
        if self.sizes_from == "the engine's config line" and source != self.sizes_from:
            return
        self.tp_size, self.pp_size, self.sizes_from = tp or 1, pp or 1, source

    def args(self, body: str) -> None:
        if self.serve_args is not None:
            return
        start = body.find("{")
        try:
            value = ast.literal_eval(body[start:]) if start >= 0 else None
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            value = None
        if isinstance(value, dict):
            self.serve_args = value
            self.sizes(value.get("tensor_parallel_size"), value.get("pipeline_parallel_size"),
                       "the server's non-default args")


class Processes:
    def __init__(self, job: Job):
        self.job = job
        self.table: OrderedDict[tuple, Proc] = OrderedDict()
        self.aliases: OrderedDict[tuple, Proc] = OrderedDict()   # (file, any name it had) -> proc

    def of(self, file: int, line: Line) -> Proc:
        key = (file,) + line.key
        proc = self.table.get(key)
        if proc is None:
            proc = self.table[key] = Proc(key=key)
            if len(self.table) > MAX_PROCESSES:
                self.table.popitem(last=False)
        else:
            self.table.move_to_end(key)
        if line.name and line.name != proc.name:
            self._rename(proc, line.name)
        if line.pid is not None:
            proc.pid = line.pid
        if line.rank is not None:
            proc.rank = line.rank
            self.job.saw_rank(line.rank)
        if line.local_rank is not None:
            proc.local_rank = line.local_rank
            if line.rank is None:
                self.job.saw_rank(line.local_rank)   # torchrun --tee on one node: local = global
        if line.host:
            proc.host = line.host
        return proc

    def named(self, file: int, pid: int, name: str) -> None:
        """A vLLM line named its process, whether or not the line matters otherwise."""
        key = (file, "pid", pid)
        proc = self.table.get(key)
        if proc is None:
            proc = self.table[key] = Proc(key=key, pid=pid)
            if len(self.table) > MAX_PROCESSES:
                self.table.popitem(last=False)
        if name != proc.name:
            self._rename(proc, name)

    def _rename(self, proc: Proc, name: str) -> None:
        self.aliases[(proc.key[0], name)] = proc
        if len(self.aliases) > MAX_PROCESSES:
            self.aliases.popitem(last=False)
        place = dict(PLACE.findall(name))
        if proc.name and (proc.tp is not None or proc.pp is not None) and not place:
            return               # keep "Worker_TP1" over a later plain "Worker"
        proc.name = name
        if place:
            proc.tp = int(place["TP"]) if "TP" in place else 0
            proc.pp = int(place["PP"]) if "PP" in place else 0
            self.job.max_tp = max(self.job.max_tp, proc.tp)

    def describe(self, proc: Proc) -> tuple[str, int | None]:
        """"Worker_PP1_TP0 (rank 2, PP stage 1, TP 0)", and the rank."""
        rank, assumed = proc.rank, ""
        if rank is None and (proc.tp is not None or proc.pp is not None):
            tp_size = self.job.tp_size
            if tp_size is None:
                named_tp = proc.name is not None and "TP" in proc.name
                tp_size = self.job.max_tp + 1 if named_tp else 1
                if named_tp:
                    assumed = f"; tp_size {tp_size} assumed: the log does not state it"
            rank = (proc.pp or 0) * tp_size + (proc.tp or 0)
        parts = [f"rank {rank}"] if rank is not None else []
        staged = (self.job.pp_size or 1) > 1 or "PP" in (proc.name or "")
        if proc.pp is not None and (proc.pp or staged):
            parts.append(f"PP stage {proc.pp}")
        if proc.tp is not None and "TP" in (proc.name or ""):
            parts.append(f"TP {proc.tp}")
        name = proc.name if proc.name and proc.name != "NCCL" else ""
        if not name and proc.host:
            name = f"NCCL {proc.host}:{proc.pid}"
        if not name:
            return (f"rank {rank}" if rank is not None else f"pid {proc.pid}"
                    if proc.pid is not None else "unprefixed output"), rank
        if proc.pid is not None and not (proc.tp is not None or proc.pp is not None or parts
                                         or name.startswith(("APIServer", "EngineCore"))):
            name = f"{name} pid={proc.pid}"
        detail = ", ".join(parts) + assumed
        return (f"{name} ({detail})" if detail else name), rank
