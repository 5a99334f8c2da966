"""The rank layout of a TP x PP job, as vLLM lays it out: TP ranks vary
fastest, then vLLM's prefill-context-parallel ranks (PCP, 1 unless it is
used), then the PP stages (rank = (pp_rank * pcp_size + pcp_rank) * tp_size +
tp_rank); and the one way a rank is named in words."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    tp_size: int
    pp_size: int
    pcp_size: int = 1

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pcp_size * self.pp_size

    def rank(self, pp_rank: int, tp_rank: int, pcp_rank: int = 0) -> int:
        return (pp_rank * self.pcp_size + pcp_rank) * self.tp_size + tp_rank

    def place(self, rank: int) -> tuple[int, int]:
        """(pp_rank, tp_rank) of a rank."""
        return rank // (self.tp_size * self.pcp_size), rank % self.tp_size

    def pcp_rank(self, rank: int) -> int:
        return rank // self.tp_size % self.pcp_size

    def tp_ranks(self, pp_rank: int, pcp_rank: int = 0) -> list[int]:
        return [self.rank(pp_rank, t, pcp_rank) for t in range(self.tp_size)]

    def tp_group(self, rank: int) -> str:
        """The name of the rank's TP group (tp_group_name)."""
        return tp_group_name(self.place(rank)[0],
                             self.pcp_rank(rank) if self.pcp_size > 1 else None)

    def groups(self) -> dict[str, list[int]]:
        groups = {self.tp_group(self.rank(p, 0, c)): self.tp_ranks(p, c)
                  for p in range(self.pp_size) for c in range(self.pcp_size)}
        groups["pp"] = list(range(self.world_size))
        return groups

    def groups_of(self, rank: int) -> dict[str, list[int]]:
        """The groups `rank` is in: its TP group, and "pp" (every rank). A probe
        lists only its own, so that its identity stays small at any scale; the
        analysis takes the union."""
        return {self.tp_group(rank): self.tp_ranks(self.place(rank)[0], self.pcp_rank(rank)),
                "pp": list(range(self.world_size))}

    def name(self, rank: int) -> str:
        pp_rank, tp_rank = self.place(rank)
        return rank_name(rank, pp_rank, self.pp_size, tp_rank)

    def vllm_name(self, rank: int) -> str:
        """The name vLLM gives the worker (its process title, its log prefix):
        'Worker_PP1_TP0', each part only where its size is over 1 (DP ranks are
        not traced: diagnose/probe/vllm.py)."""
        pp_rank, tp_rank = self.place(rank)
        parts = [("PP", pp_rank, self.pp_size),
                 ("PCP", self.pcp_rank(rank), self.pcp_size), ("TP", tp_rank, self.tp_size)]
        return "Worker" + "".join(f"_{tag}{index}" for tag, index, size in parts if size > 1)


def tp_group_name(pp_rank: int, pcp_rank: int | None = None) -> str:
    """The name of a TP group: 'tp{pp}', and '.{pcp}' after it under PCP."""
    return f"tp{pp_rank}" if pcp_rank is None else f"tp{pp_rank}.{pcp_rank}"


def rank_name(rank: int, pp_rank: int | None = None, pp_size: int | None = None,
              tp_rank: int | None = None) -> str:
    """'rank 6 (pp 3/4, tp 0)', or 'rank 6' outside a TP x PP layout."""
    if pp_rank is None or tp_rank is None:
        return f"rank {rank}"
    return f"rank {rank} (pp {pp_rank}/{pp_size}, tp {tp_rank})"


def rank_list(ranks, driver: bool = False) -> str:
    """[0, 1, 2, 3, 4, 5, 7] -> 'ranks 0-5 and 7'; [3] -> 'rank 3'; with
    driver=True the driver ends the list."""
    ranks = sorted(ranks)
    runs = _runs(ranks)
    if runs:
        runs[0] = f"{'rank' if len(ranks) == 1 else 'ranks'} {runs[0]}"
    if driver:
        runs.append("the driver")
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


def rank_ranges(ranks) -> str:
    """[0, 1, 2, 3, 6] -> '0-3,6': what parse_ranks reads."""
    return ",".join(_runs(ranks))


def _runs(ranks) -> list[str]:
    ranks = sorted(ranks)
    runs, start = [], None
    for index, rank in enumerate(ranks):
        if start is None:
            start = rank
        if index + 1 == len(ranks) or ranks[index + 1] != rank + 1:
            runs.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    return runs


MAX_PARSED_RANKS = 1 << 20
RANK_RANGE = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)


def parse_ranks(text: str) -> set[int]:
    """'6' -> {6}; '0-3,6' -> {0, 1, 2, 3, 6}. Raises ValueError on anything else,
    and on more than MAX_PARSED_RANKS ranks in all (overlaps counted)."""
    ranks: set[int] = set()
    count = 0
    for part in text.split(","):
        found = RANK_RANGE.fullmatch(part.strip())
        if found is None:
            raise ValueError(f"not a rank or a range of ranks: {part.strip()!r}")
        low = int(found[1])
        high = int(found[2]) if found[2] else low
        if high < low:
            raise ValueError(f"the range {part.strip()} runs backwards")
        count += high - low + 1
        if count > MAX_PARSED_RANKS:
            raise ValueError(f"{text[:40]!r} holds more than {MAX_PARSED_RANKS} ranks")
        ranks.update(range(low, high + 1))
    return ranks
