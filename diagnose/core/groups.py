"""A process group's members in a probe file's identity (docs/run-dir.md): written
as ranges ("0-16383", "8-15", "0-3,6"), so that an identity stays a few bytes
at any scale, and read once for each distinct text, the list shared by every
rank that names it. A list of ranks, as files before this wrote, still reads."""
from __future__ import annotations

from diagnose.core.layout import MAX_PARSED_RANKS, parse_ranks, rank_ranges

MAX_KEPT = 1 << 22      # members a reader keeps, over all the distinct groups it has read


def encode(groups: dict[str, list[int]], memo: dict[int, str] | None = None) -> dict[str, str]:
    """`memo`: each members list's text by the list's id, for a writer of many
    identities that share their lists (a node's ranks)."""
    if memo is None:
        return {name: rank_ranges(members) for name, members in groups.items()}
    for members in groups.values():
        if id(members) not in memo:
            memo[id(members)] = rank_ranges(members)
    return {name: memo[id(members)] for name, members in groups.items()}


class GroupReader:
    """Decodes the `groups` of identities; ValueError (naming Identity.groups)
    for anything no writer writes, or for more members than MAX_PARSED_RANKS in
    one identity or MAX_KEPT in all."""

    def __init__(self):
        self._known: dict[str, list[int]] = {}
        self._kept = 0

    def read(self, raw: object) -> dict[str, list[int]]:
        if not isinstance(raw, dict):
            raise ValueError("Identity.groups: not an object")
        groups, count = {}, 0
        for name, members in raw.items():
            groups[name] = self._members(name, members)
            count += len(groups[name])
            if count > MAX_PARSED_RANKS:
                raise ValueError(f"Identity.groups: over {MAX_PARSED_RANKS} members in all")
        return groups

    def _members(self, name: str, members: object) -> list[int]:
        if isinstance(members, list):
            if not all(type(member) is int for member in members):
                raise ValueError(f"Identity.groups[{name[:40]!r}]: a member is not a rank")
            return members
        if not isinstance(members, str):
            raise ValueError(f"Identity.groups[{name[:40]!r}]: neither ranges nor a list")
        if not members:
            return []
        known = self._known.get(members)
        if known is None:
            try:
                known = sorted(parse_ranks(members))
            except ValueError as error:
                raise ValueError(f"Identity.groups[{name[:40]!r}]: {error}") from None
            self._kept += len(known)
            if self._kept > MAX_KEPT:
                raise ValueError(f"Identity.groups: over {MAX_KEPT} distinct members in this "
                                 f"run dir")
            self._known[members] = known
        return known
