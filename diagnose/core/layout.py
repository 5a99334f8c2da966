"""The rank layout of a TP x PP job, as vLLM lays it out (rank = pp_rank *
tp_size + tp_rank), and the one way a rank is named in words."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Layout:
    tp_size: int
    pp_size: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    def rank(self, pp_rank: int, tp_rank: int) -> int:
        return pp_rank * self.tp_size + tp_rank

    def place(self, rank: int) -> tuple[int, int]:
        """(pp_rank, tp_rank) of a rank."""
        return divmod(rank, self.tp_size)

    def tp_ranks(self, pp_rank: int) -> list[int]:
        return [self.rank(pp_rank, t) for t in range(self.tp_size)]

    def groups(self) -> dict[str, list[int]]:
        groups = {f"tp{p}": self.tp_ranks(p) for p in range(self.pp_size)}
        groups["pp"] = list(range(self.world_size))
        return groups

    def name(self, rank: int) -> str:
        pp_rank, tp_rank = self.place(rank)
        return rank_name(rank, pp_rank, self.pp_size, tp_rank)


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
    runs, start = [], None
    for index, rank in enumerate(ranks):
        if start is None:
            start = rank
        if index + 1 == len(ranks) or ranks[index + 1] != rank + 1:
            runs.append(str(start) if start == rank else f"{start}-{rank}")
            start = None
    if runs:
        runs[0] = f"{'rank' if len(ranks) == 1 else 'ranks'} {runs[0]}"
    if driver:
        runs.append("the driver")
    return runs[0] if len(runs) == 1 else ", ".join(runs[:-1]) + " and " + runs[-1]


MAX_PARSED_RANKS = 1 << 20
RANK_RANGE = re.compile(r"(\d+)(?:-(\d+))?", re.ASCII)


def parse_ranks(text: str) -> set[int]:
    """'6' -> {6}; '0-3,6' -> {0, 1, 2, 3, 6}. Raises ValueError on anything else."""
    ranks: set[int] = set()
    for part in text.split(","):
        found = RANK_RANGE.fullmatch(part.strip())
        if found is None:
            raise ValueError(f"not a rank or a range of ranks: {part.strip()!r}")
        low = int(found[1])
        high = int(found[2]) if found[2] else low
        if high < low:
            raise ValueError(f"the range {part.strip()} runs backwards")
        if high - low >= MAX_PARSED_RANKS:
            raise ValueError(f"the range {part.strip()} holds more than {MAX_PARSED_RANKS} ranks")
        ranks.update(range(low, high + 1))
    return ranks
