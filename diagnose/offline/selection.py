"""What `diag analyze` shows of a judged job: --ranks and --groups, as
torchfrtrace's --selected-ranks and --pg-filters. The analysis sees every rank,
so a selection never changes who is to blame: it narrows the rank table (and
each row's last collective to the chosen groups), and the output says so."""
from __future__ import annotations

from dataclasses import dataclass

from diagnose.core.layout import rank_list
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.offline.report import RankRow, rank_rows


class SelectionError(ValueError):
    """A rank or group the job does not have; the message lists what it has."""


@dataclass
class Selection:
    ranks: set[int] | None = None       # --ranks, parsed
    groups: list[str] | None = None     # --groups, as given: diag's labels or torch's names

    @property
    def narrows(self) -> bool:
        return self.ranks is not None or self.groups is not None

    def rows(self, snapshot: Snapshot, verdicts: list[Verdict],
             names: dict[str, set[str]]) -> list[RankRow]:
        """The rows shown; SelectionError for a rank or group not in the job."""
        labels = self._labels(snapshot, names)
        members = None if labels is None else _members(snapshot, labels)
        if self.ranks is not None and not self.ranks <= set(snapshot.ranks):
            missing = sorted(self.ranks - set(snapshot.ranks))
            raise SelectionError(f"--ranks: {rank_list(missing)} not in this job "
                                 f"(it has {rank_list(snapshot.ranks) or 'no ranks'})")
        return [row for row in rank_rows(snapshot, verdicts, labels)
                if (self.ranks is None or row.rank in self.ranks)
                and (members is None or row.rank in members)]

    def caption(self, rows: list[RankRow], snapshot: Snapshot) -> str | None:
        if not self.narrows:
            return None
        shown = rank_list([row.rank for row in rows]) if rows else "no rank"
        groups = f" in {', '.join(self.groups)}" if self.groups else ""
        return (f"showing {shown}{groups} of {len(snapshot.ranks)}; the verdicts judge "
                f"every rank")

    def to_json(self, rows: list[RankRow], snapshot: Snapshot) -> dict:
        return {"ranks": [row.rank for row in rows], "groups": self.groups,
                "of": len(snapshot.ranks)}

    def _labels(self, snapshot: Snapshot, names: dict[str, set[str]]) -> set[str] | None:
        if self.groups is None:
            return None
        known = _group_labels(snapshot)
        labels = set()
        for name in self.groups:
            found = names.get(name, {name}) & known
            if not found:
                raise SelectionError(f"--groups: no group {name!r} in this job (it has "
                                     f"{', '.join(sorted(known)) or 'none'})")
            labels |= found
        return labels


def _group_labels(snapshot: Snapshot) -> set[str]:
    labels = set()
    for state in snapshot.ranks.values():
        labels.update(state.identity.groups)
        labels.update(record.group for record in state.collectives)
    return labels


def _members(snapshot: Snapshot, labels: set[str]) -> set[int]:
    """Ranks in one of the groups: listed as members, or with a call in it."""
    found, as_sets = set(), {}      # id of a members list -> its set: ranks share the lists
    for rank, state in snapshot.ranks.items():
        for label in labels & state.identity.groups.keys():
            members = state.identity.groups[label]
            if id(members) not in as_sets:
                as_sets[id(members)] = set(members)
            if rank in as_sets[id(members)]:
                found.add(rank)
        if any(record.group in labels for record in state.collectives):
            found.add(rank)
    return found
