"""The rank the others wait for, from the collectives that timed out.

In order of authority: PyTorch's own desync report (TORCH_NCCL_DESYNC_DEBUG)
names the lagging ranks; else, within one process group, the rank whose last
completed work is lowest; else the ranks the log shows to exist that reported
no timeout at all (a rank that is not waiting in the collective says nothing:
gloo has no watchdog, and NCCL's watchdog only fires in the ranks that wait).
"""
from __future__ import annotations

import os

from diagnose.core.layout import rank_list
from diagnose.offline.logs.collectives import Collectives, Record
from diagnose.offline.logs.model import Finding, Kind, Severity
from diagnose.offline.logs.reader import parse

COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "broadcast", "reduce", "barrier", "all_to_all",
               "all_to_all_single", "gather", "scatter", "send", "recv", "isend", "irecv")
RERUN = ("diag launch --on-hang kill -- <the same command> names the culprit and the "
         "collective it missed while the job hangs")


def behind(collectives: Collectives, ctx) -> tuple[Finding, tuple] | None:
    records = list(collectives.records.values())
    if not records and not collectives.desyncs:
        return None
    found = _desync(collectives, ctx) or _sequence(records, ctx) or _silent(records, ctx)
    if found is None:
        return None
    finding, culprits = found
    finding.chain = [_waited(record, ctx) for record in sorted(records, key=_rank_of)
                     if _rank_of(record) not in culprits]
    events = [record.event for record in records] + [d.event for d in collectives.desyncs]
    return finding, min(event.order for event in events)


def _desync(collectives: Collectives, ctx):
    for report in collectives.desyncs:
        ranks, seq = report.ranks, report.seq
        by = collectives.reporter
        source = (f"PyTorch's desync report (TORCH_NCCL_DESYNC_DEBUG) of rank {by[0]}, which "
                  f"timed out in {by[1]} #{by[2]}" if by else "PyTorch's desync report")
        if report.kind == "all_joined":
            return _finding(report.event, ctx, Kind.COLLECTIVE_STUCK, None,
                            f"{rank_list(ranks)} all joined collective #{seq} and none "
                            f"finished it: no rank is behind ({source})",
                            "every rank is inside the same collective, so the collective itself "
                            "is stuck: suspect the network or NCCL transport, or a GPU that "
                            "stopped (check dmesg for Xid errors, and NCCL_DEBUG=INFO output)"), []
        what = (f"finished collective #{seq - 1} but never joined #{seq}" if report.kind == "missed"
                else "never joined any collective")
        return _finding(report.event, ctx, Kind.COLLECTIVE_BEHIND, ranks,
                        f"{rank_list(ranks)} {what}: the other ranks wait for it ({source})",
                        f"look at what {rank_list(ranks)} did instead of that collective "
                        f"(its own log lines, its stack with py-spy dump); {RERUN}"), ranks
    return None


def _sequence(records: list[Record], ctx):
    groups: dict[str, list[Record]] = {}
    for record in records:
        if record.group != "gloo" and _done(record) is not None:
            groups.setdefault(record.group, []).append(record)
    for group, members in sorted(groups.items(), key=lambda item: -len(item[1])):
        low, high = min(map(_done, members)), max(map(_done, members))
        if len(members) < 2 or low == high:
            continue
        late = [record for record in members if _done(record) == low]
        ahead = [record for record in members if _done(record) == high]
        ranks = [_rank_of(record) for record in late]
        where = f" in {group}" if group else ""
        waits = "; ".join(f"rank {_rank_of(record)} timed out in {record.op or 'work'} "
                          f"#{record.seq}" for record in late if record.seq is not None)
        summary = (f"{rank_list(ranks)} is behind{where}: its last completed collective is "
                   f"#{low}, {rank_list([_rank_of(r) for r in ahead])} completed #{high}"
                   + (f" ({waits})" if waits else ""))
        return _finding(late[0].event, ctx, Kind.COLLECTIVE_BEHIND, ranks, summary,
                        f"the others wait for {rank_list(ranks)}: look at what it did after "
                        f"collective #{low} (its own log lines, its stack); {RERUN}"), ranks
    return None


def _silent(records: list[Record], ctx):
    waiting = sorted({_rank_of(record) for record in records} - {None})
    silent = sorted(set(ctx.job.ranks) - set(waiting)) if waiting else []
    first = min(records, key=lambda record: record.event.order) if records else None
    if first is None:
        return None
    ops = {_collective(record) for record in records} - {None}
    op = "/".join(sorted(ops)) or "the same collective"
    timeouts = {record.ran_ms for record in records} - {None}
    after = f" after {max(timeouts) / 1000:.0f} s" if timeouts else ""
    backend = "gloo" if first.group == "gloo" else "NCCL"
    if silent:
        note = (" gloo has no watchdog: a rank that is not waiting prints nothing, so the rank "
                "the others wait for is the one without a timeout." if backend == "gloo" else "")
        root = ctx.torchrun_root
        if root is not None and root in waiting:
            note += (f" torchrun's summary calls rank {root} the \"Root Cause\": it is only the "
                     f"first rank to exit, and it was waiting too.")
        return _finding(first.event, ctx, Kind.COLLECTIVE_BEHIND, silent,
                        f"{rank_list(silent)} did not join the {op} that "
                        f"{rank_list(waiting)} timed out in ({backend}{after}): it skipped it, is "
                        f"behind, or is stuck elsewhere",
                        f"look at what {rank_list(silent)} did instead (its last log lines, "
                        f"its stack).{_last_words(silent, ctx)}{note} {RERUN}"), silent
    return _finding(first.event, ctx, Kind.COLLECTIVE_STUCK, None,
                    f"{rank_list(waiting)} timed out in {op} ({backend}{after}) at the same "
                    f"point; the log shows no rank behind",
                    "the rank the others wait for printed nothing here: find the ranks missing "
                    "from this log (or pass every rank's log to diag logs); if every rank of the "
                    f"job is here, the collective itself is stuck (network, NCCL, a GPU). "
                    f"{RERUN}"), []


def _waited(record: Record, ctx) -> Finding:
    rank = _rank_of(record)
    op = _collective(record)
    what = f"timed out in {op}" if op else "timed out at"
    parts = [f"#{record.seq}"] if record.seq is not None else []
    if record.ran_ms:
        parts.append(f"after {record.ran_ms / 1000:.0f} s")
    if record.completed is not None:
        parts.append(f"last completed #{record.completed}, last enqueued #{record.enqueued}")
    frame = getattr(record.event.info.get("exception"), "frame", None)
    if frame is not None:
        parts.append(f"at {frame.where()}")
    event = record.event
    return Finding(Kind.COLLECTIVE_TIMEOUT, Severity.HANG,
                   f"rank {rank} waited: {what} {', '.join(parts)}".strip(),
                   process=f"rank {rank}", rank=rank, path=ctx.files[event.file], line=event.line,
                   text=event.text, first=event.stamp, last=event.stamp)


def _last_words(ranks: list[int], ctx) -> str:
    said = []
    for rank in ranks:
        if rank in ctx.job.last_lines:
            file, number, raw = ctx.job.last_lines[rank]
            body = parse(number, raw).body.strip()
            said.append(f" Rank {rank}'s last line: \"{body}\" "
                        f"({os.path.basename(ctx.files[file])}:{number}).")
    return "".join(said)


def _finding(event, ctx, kind: Kind, ranks, summary: str, advice: str) -> Finding:
    return Finding(kind, Severity.HANG, summary, advice,
                   process=f"{rank_list(ranks)}" if ranks else "",
                   rank=ranks[0] if ranks and len(ranks) == 1 else None,
                   path=ctx.files[event.file], line=event.line, text=event.text,
                   first=event.stamp, last=event.stamp)


def _done(record: Record) -> int | None:
    if record.completed is not None:
        return record.completed
    return record.seq - 1 if record.seq is not None else None


def _rank_of(record: Record) -> int:
    return record.rank if record.rank is not None else record.group_rank


def _collective(record: Record) -> str | None:
    error = record.event.info.get("exception")
    functions = getattr(error, "functions", ())
    named = [name for name in functions if name in COLLECTIVES]
    if named:
        return named[-1]
    return record.op
