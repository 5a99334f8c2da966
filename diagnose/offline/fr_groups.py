"""The process groups of a directory of Flight Recorder dumps: who is in each,
and the label diag gives it.

Every dump lists its groups in 'pg_config' (pg name -> desc and ranks; gloo's is
empty) and names a group in each entry by (pg name, desc). A group is labelled
by its desc where that is unique ("tp0"), "world" for the default group, else
pg<name>; a pg name whose dumps list different ranks (split_group, or a group of
one made on each rank) is one group per set of ranks.
"""
from __future__ import annotations

import ast
import functools
import itertools
from collections import defaultdict
from dataclasses import dataclass

from diagnose.core.snapshot import CollectiveRecord

MAX_GROUPS = 1 << 16        # pg_config entries read from one dump
MAX_MEMBERS = 1 << 16       # ranks of one pg_config group that diag takes (16,384-rank jobs fit)


def config_of(config, name: str, notes: list[str]) -> dict[str, tuple[str, frozenset[int]]]:
    """pg name -> (desc, ranks). A rank list is read once however many pgs share
    it (a pickle can point every pg at one long list). A list of more than
    MAX_MEMBERS ranks is not read: the group's members are then the ranks whose
    dumps have entries in it, and one note says so."""
    found, parsed, over = {}, {}, []
    pgs = itertools.islice(config.items(), MAX_GROUPS) if isinstance(config, dict) else ()
    for pg_name, pg in pgs:
        if isinstance(pg, dict) and isinstance(pg_name, (str, int)) and pg_name != "":
            desc, ranks = pg.get("desc"), pg.get("ranks")
            if id(ranks) not in parsed:
                parsed[id(ranks)] = frozenset(_parse_ranks(ranks))
                if _too_many(ranks):
                    over.append(str(pg_name)[:40])
            found[str(pg_name)] = (desc if isinstance(desc, str) else "", parsed[id(ranks)])
    if over:
        notes.append(f"{name}: process group {', '.join(over[:3])}{' and more' * (len(over) > 3)} "
                     f"lists over {MAX_MEMBERS} ranks; its members are the ranks with entries in it")
    return found


def _too_many(ranks) -> bool:
    if isinstance(ranks, str):
        return len(ranks) > MAX_MEMBERS * 16 or ranks.count(",") >= MAX_MEMBERS
    return isinstance(ranks, (list, tuple)) and len(ranks) > MAX_MEMBERS


@dataclass
class Group:
    label: str              # the name records carry: the pg's description, or pg<name>
    members: list[int]      # global ranks, sorted


def resolve_groups(dumps: dict, unreadable: set[int]) -> dict[int, dict[str, Group]]:
    """rank -> pg name -> its group, for the pgs the rank's pg_config lists or its
    entries use (every rank is in the default group): linear in ranks x their
    groups, never ranks x all groups. A pg name whose dumps list different ranks
    (split_group, or a group of one made on each rank) is one group per set of
    ranks. The default group holds every rank with a dump, readable or not."""
    descs: dict[str, str] = {}
    rank_sets: dict[str, dict[int, frozenset[int]]] = defaultdict(dict)  # as each dump lists them
    seen: dict[str, set[int]] = defaultdict(set)                         # ranks with entries in it
    for rank, dump in dumps.items():
        for pg_name, (desc, ranks) in dump.config.items():
            descs.setdefault(pg_name, desc)
            if ranks:
                rank_sets[pg_name][rank] = ranks
        for pg_name, desc in dump.pgs.items():
            descs.setdefault(pg_name, desc)
            seen[pg_name].add(rank)
    uses = defaultdict(int)
    for desc in descs.values():
        uses[desc] += 1
    groups: dict[int, dict[str, Group]] = {rank: {} for rank in dumps}
    for pg_name, desc in descs.items():
        label = ("world" if desc == "default_pg" else desc
                 if desc and desc != "undefined" and uses[desc] == 1 else f"pg{pg_name}")
        listed = rank_sets[pg_name]
        variants = set(listed.values())
        made: dict[frozenset[int], Group] = {}
        for rank in dumps if desc == "default_pg" else listed.keys() | seen[pg_name]:
            ranks = listed.get(rank) or (next(iter(variants)) if len(variants) == 1
                                         else frozenset(seen[pg_name]))
            if desc == "default_pg":
                ranks = ranks | set(dumps) | unreadable
            if ranks not in made:
                name = label if len(variants) < 2 else f"{label}{_rank_text(ranks)}"
                made[ranks] = Group(name, sorted(ranks))
            groups[rank][pg_name] = made[ranks]
    return groups


def _rank_text(ranks) -> str:
    return "[" + ",".join(map(str, sorted(ranks))) + "]"


def _parse_ranks(text) -> list[int]:
    if _too_many(text):
        return []
    if isinstance(text, str):
        return list(_parse_rank_text(text))
    return _rank_list(text)


@functools.lru_cache(maxsize=4096)
def _parse_rank_text(text: str) -> tuple[int, ...]:
    """Every dump repeats its groups' rank lists: each text is parsed once."""
    try:
        return tuple(_rank_list(ast.literal_eval(text)))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        return ()


def _rank_list(ranks) -> list[int]:
    if isinstance(ranks, (list, tuple)) and all(
            isinstance(rank, int) and not isinstance(rank, bool) and 0 <= rank < 2 ** 31
            for rank in ranks):
        return list(ranks)
    return []


def place(records: list[CollectiveRecord], groups: dict[str, Group]) -> list[CollectiveRecord]:
    """A dump's records, made from its rows (fr_entries.ROW_FIELDS) with the pg
    name as their group and the peer group-local, put in place: each in its
    group's label and with its peer's global rank, send/recv numbered per
    (group, op, peer). Returns the same list.

    A ring that wrapped holds a different stretch of each rank's sends and
    recvs, so counting from the ring's start would pair the n-th send of one
    dump with another recv in the other. NCCL completes a send and its recv
    together, so the numbers count from the last completed call of each
    (group, op, peer), which is 0 on both sides; calls after it are 1, 2, ...
    Where no call completed (gloo records no completion), they count from 1."""
    p2p: dict[tuple, list[CollectiveRecord]] = defaultdict(list)
    for record in records:
        pg_name = record.group
        group = groups.get(pg_name) or Group(f"pg{pg_name}", [])
        record.group = group.label
        peer = record.peer
        if peer is not None:
            members = group.members
            record.peer = peer = members[peer] if peer < len(members) else peer
            p2p[(group.label, record.op, peer)].append(record)
    for calls in p2p.values():
        done = [index for index, record in enumerate(calls) if record.state == "completed"]
        first = -done[-1] if done else 1
        for index, record in enumerate(calls):
            record.seq = first + index
    return records


def group_names(dumps: dict, groups: dict[int, dict[str, Group]]
                 ) -> dict[str, set[str]]:
    """Each name torch gives a group (its pg name, its desc) and diag's own label
    -> the labels diag gives it (one pg name may be several groups)."""
    names: dict[str, set[str]] = defaultdict(set)
    for rank, by_name in groups.items():
        dump = dumps[rank]
        for pg_name, group in by_name.items():
            desc = dump.config.get(pg_name, ("", None))[0] or dump.pgs.get(pg_name, "")
            for name in (pg_name, desc, group.label):
                if name:
                    names[name].add(group.label)
    return dict(names)
