"""Where the ranks parted: a collective that surfaces as a mismatch or a missing
peer was often lost many calls before. Counted per call site, the calls of
each member up to the one that surfaced show where: rank 2 made 39 all_reduce
calls at train.py:10 where ranks 0-1 and 3 made 40."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from diagnose.analysis.view import View
from diagnose.analysis.wording import Words, rank_list
from diagnose.core.vocab import P2P_OPS

MAX_SITES = 2          # differing sites a sentence names; evidence has them all


@dataclass
class Parting:
    since_seq: int                                  # counted from here: every member's records reach back
    counts: dict[str, dict[str, int]]               # "op at site" -> {rank: calls}, where they differ


def parting(view: View, group: str, seq: int, culprits: list[int],
            others: list[int]) -> Parting | None:
    """The call sites where the culprits made more or fewer calls of `group` than
    the others, counting every member's calls from the first seq all of them
    still hold up to `seq`; None where they made the same."""
    members = culprits + others
    records = {rank: [record for record in view.ranks[rank].collectives
                      if record.group == group and record.op not in P2P_OPS]
               for rank in members if rank in view.ranks}
    if len(records) < len(members) or not all(records.values()):
        return None
    since = max(min(record.seq for record in held) for held in records.values())
    counts = {rank: Counter(_site_of(record) for record in held if since <= record.seq <= seq)
              for rank, held in records.items()}
    usual = Counter(tuple(sorted(counts[rank].items())) for rank in others).most_common(1)
    if not usual:
        return None
    expected = dict(usual[0][0])
    differ = {site for rank in culprits
              for site in set(counts[rank]) | set(expected) if counts[rank][site] != expected.get(site, 0)}
    if not differ:
        return None
    return Parting(since, {site: {str(rank): counts[rank][site] for rank in members}
                           for site in sorted(differ)})


def add_parting(words: Words, found: Parting, culprits: list[int], others: list[int]) -> Words:
    """'; rank 2 made 39 all_reduce calls at train.py:10 where ranks 0-1 and 3
    made 40': the sites where the culprits made fewer calls (a call they
    skipped), else those where they made more."""
    usual = {site: Counter(calls[str(rank)] for rank in others).most_common(1)[0][0]
             for site, calls in found.counts.items()}
    fewer = [site for site in found.counts
             if any(found.counts[site][str(rank)] < usual[site] for rank in culprits)]
    since = f" since seq {found.since_seq}" if found.since_seq else ""
    for site in (fewer or sorted(found.counts))[:MAX_SITES]:
        made = {found.counts[site][str(rank)] for rank in culprits}
        words.add("; ").culprit(rank_list(culprits)).add(
            f" made {_number(made)} {site}{since} where {rank_list(others)} made {usual[site]}")
    return words


def _site_of(record) -> str:
    return f"{record.op} calls at {record.site}" if record.site else f"{record.op} calls"


def _number(made: set[int]) -> str:
    return str(made.pop()) if len(made) == 1 else "/".join(map(str, sorted(made)))
