"""A snapshot as a Chrome trace (JSON), for ui.perfetto.dev or chrome://tracing.

Each rank is a process with two tracks: its phases, and its collectives; the
driver is one more process. Slices still open when the snapshot was taken end
at `taken_at` and carry `"open": true`. Times are microseconds since the
earliest event.
"""
from __future__ import annotations

from diagnose.core.snapshot import RankState, Snapshot

PHASES_TRACK = 1
COLLECTIVES_TRACK = 2


def to_perfetto(snapshot: Snapshot) -> dict:
    processes = [(rank, state.identity.name, state) for rank, state in snapshot.ranks.items()]
    if snapshot.driver is not None:
        driver_pid = max(snapshot.ranks, default=-1) + 1
        processes.append((driver_pid, "driver", snapshot.driver))
    origin = _earliest(snapshot)
    events = []
    for pid, name, state in processes:
        events += _track_names(pid, name)
        events += _phase_slices(pid, state, origin, snapshot.taken_at)
        events += _collective_slices(pid, state, origin, snapshot.taken_at)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"run_dir": snapshot.run_dir, "taken_at": snapshot.taken_at}}


def _earliest(snapshot: Snapshot) -> float:
    states = list(snapshot.ranks.values()) + ([snapshot.driver] if snapshot.driver else [])
    times = [event.start for state in states for event in state.phases + state.open_phases]
    times += [record.t_enqueue for state in states for record in state.collectives]
    return min(times, default=snapshot.taken_at)


def _track_names(pid: int, name: str) -> list[dict]:
    return [
        {"ph": "M", "name": "process_name", "pid": pid, "args": {"name": name}},
        {"ph": "M", "name": "process_sort_index", "pid": pid, "args": {"sort_index": pid}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": PHASES_TRACK, "args": {"name": "phases"}},
        {"ph": "M", "name": "thread_name", "pid": pid, "tid": COLLECTIVES_TRACK,
         "args": {"name": "collectives"}},
    ]


def _slice(pid: int, tid: int, name: str, category: str, start: float, end: float | None,
           origin: float, now: float, args: dict) -> dict:
    if end is None:
        end, args = now, args | {"open": True}
    return {"ph": "X", "pid": pid, "tid": tid, "name": name, "cat": category,
            "ts": _us(start - origin), "dur": _us(max(0.0, end - start)), "args": args}


def _phase_slices(pid: int, state: RankState, origin: float, now: float) -> list[dict]:
    events = {(event.name, event.start): event for event in state.phases + state.open_phases}
    return [_slice(pid, PHASES_TRACK, event.name, "phase", event.start, event.end, origin, now,
                   {"step": event.step} if event.step is not None else {})
            for event in sorted(events.values(), key=lambda event: event.start)]


def _collective_slices(pid: int, state: RankState, origin: float, now: float) -> list[dict]:
    return [_slice(pid, COLLECTIVES_TRACK, f"{record.group} {record.op}", "collective",
                   record.t_enqueue, record.t_complete, origin, now,
                   {"seq": record.seq, "peer": record.peer, "shapes": record.shapes,
                    "dtype": record.dtype, "bytes": record.nbytes, "site": record.site,
                    "state": record.state})
            for record in state.collectives]


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)
