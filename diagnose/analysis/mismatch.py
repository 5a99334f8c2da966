"""Collectives the members disagree on, and calls whose own sizes cannot be right."""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict

from diagnose.analysis.calls import describe_call, malformed, signature
from diagnose.analysis.position import current_step
from diagnose.analysis.sites import add_parting, parting
from diagnose.analysis.view import View
from diagnose.analysis.wording import Words, rank_list
from diagnose.core.snapshot import CollectiveRecord, Verdict
from diagnose.core.vocab import VerdictKind


def mismatch_verdicts(view: View) -> list[Verdict]:
    """The first call of each group that its members disagree on, or that is
    malformed: the minority (the malformed) are the culprits."""
    verdicts, reported = [], set()
    found = sorted(view.disagreeing | _malformed_calls(view), key=lambda key: key[1:])
    for key in found:
        if key[0] in reported:
            continue
        verdict = _disagreement_verdict(view, key) or _malformed_verdict(view, key)
        if verdict is not None:
            reported.add(key[0])
            verdicts.append(verdict)
    return verdicts


def _malformed_calls(view: View) -> set[tuple[str, int, int]]:
    """Only a source that records outputs (Flight Recorder) can have them.
    Whether a call is malformed depends only on what the view compares to tell
    disagreeing members apart, so where they agree the first member answers
    for all."""
    found = set()
    for key, records in view.calls.items():
        first = next(iter(records.values()))
        if first.out_shapes is None:
            continue
        members = records.values() if key in view.disagreeing else (first,)
        if any(map(malformed, members)):
            found.add(key)
    return found


def _malformed_verdict(view: View, key: tuple[str, int, int]) -> Verdict | None:
    group, seq, _ = key
    records = view.calls[key]
    reasons = {rank: malformed(record) for rank, record in records.items()}
    culprits = sorted(rank for rank, reason in reasons.items() if reason)
    if not culprits:
        return None
    first = records[culprits[0]]
    words = Words(f"{group} seq {seq}: ").culprit(rank_list(culprits)).add(
        f" called {describe_call(signature(first))}: {reasons[culprits[0]]}")
    return _verdict(view, key, culprits, sorted(set(records) - set(culprits)), words)


def _disagreement_verdict(view: View, key: tuple[str, int, int]) -> Verdict | None:
    group, seq, part = key
    records = view.calls[key]
    signatures = {rank: signature(record) for rank, record in records.items()}
    counts = Counter(signatures.values())
    if len(counts) < 2:
        return None
    top = counts.most_common()
    majority = top[0][0] if top[0][1] > top[1][1] else None
    why = None
    if majority is None:  # a tie (two ranks, say)
        majority, why = _tie_break(view, key, signatures)
    culprits = sorted(rank for rank, sig in signatures.items() if sig != majority)
    victims = sorted(rank for rank, sig in signatures.items() if sig == majority)
    calls = "; ".join(f"{rank_list(r for r, s in signatures.items() if s == sig)}: "
                      f"{describe_call(sig)}" for sig, _ in top)
    where = f"{group} seq {seq}" + (f" (call {part + 1} of a coalesced group)" if part else "")
    words = Words(f"{where}: members disagree on the collective: {calls}")
    if why:
        words.add(f"; {describe_call(majority)} was due ({why}), so ")
        words.culprit(rank_list(culprits)).add(_departure(majority, signatures[culprits[0]]))
    verdict = _verdict(view, key, culprits, victims, words)
    found = parting(view, group, seq, culprits, victims) if culprits and victims else None
    if found is not None:
        add_parting(words, found, culprits, victims)
        verdict.summary, verdict.spans = words.text, words.spans
        verdict.evidence["calls_per_site"] = asdict(found)
    return verdict


def _verdict(view: View, key: tuple[str, int, int], culprits: list[int], victims: list[int],
             words: Words) -> Verdict:
    group, seq, _ = key
    records: dict[int, CollectiveRecord] = view.calls[key]
    return Verdict(
        kind=VerdictKind.COLLECTIVE_MISMATCH, culprit_ranks=culprits, victim_ranks=victims,
        summary=words.text, spans=words.spans,
        group=group, seq=seq, step=current_step(view.ranks[culprits[0]]),
        evidence={"calls": {str(rank): asdict(record) for rank, record in records.items()}})


def _tie_break(view: View, key: tuple[str, int, int],
               signatures: dict[int, tuple]) -> tuple[tuple | None, str | None]:
    """The call a tie goes to, and why: the one the group's history expects, or
    the one whose sizes fit together where the others' do not."""
    tied = set(signatures.values())
    due, why = _expected_signature(view, key, tied)
    if due is not None:
        return due, why
    sound = {signatures[rank] for rank, record in view.calls[key].items()
             if not malformed(record)}
    if len(sound) == 1 and len(sound) < len(tied):
        return sound.pop(), "the other calls' sizes or dtypes do not fit together"
    return None, None


def _departure(due: tuple, made: tuple) -> str:
    if due[0] == made[0]:
        return " made it with other sizes or dtypes"
    return " skipped or added a call"


def _expected_signature(view: View, key: tuple[str, int, int],
                        tied: set[tuple]) -> tuple[tuple | None, str | None]:
    """Which of the `tied` calls the group's history says this call should be,
    and why, among the calls (at the same place of a coalesced group) every
    member agreed on before it. Engine steps repeat the same calls: first the
    call one period back (the period is the shortest that fits the recent
    history); else the one call of `tied` the group has made before, where only
    one has."""
    group, seq, part = key
    agreed = {}
    for (name, number, place), records in view.calls.items():
        signatures = {signature(record) for record in records.values()}
        if (name, place) == (group, part) and number < seq and len(records) > 1 \
                and len(signatures) == 1:
            agreed[number] = signatures.pop()
    numbers = sorted(agreed, reverse=True)
    for period in range(1, len(numbers) // 2 + 1):
        recent = numbers[:2 * period]
        if all(agreed.get(n - period, agreed[n]) == agreed[n] for n in recent):
            due = agreed.get(seq - period)
            return (due, "the group's calls repeat") if due in tied else (None, None)
    familiar = tied & set(agreed.values())
    if len(familiar) == 1:
        return familiar.pop(), "the group made it before, never the other"
    return None, None
