"""The status line under the verdict, and what the grid says while the job has
no rank yet."""
from __future__ import annotations

import shlex
import time
from dataclasses import replace

from diagnose.core.snapshot import Snapshot

COMMAND_CHARS = 120     # of the command, on the first screen


def clock(at: float) -> str:
    """A time as the screen shows it: 04:37:07 UTC."""
    return time.strftime("%H:%M:%S UTC", time.gmtime(at))


def status_text(snapshot: Snapshot, blocking: set[int], query: str, servers: list[str],
                read_only: bool) -> str:
    count = len(snapshot.ranks)
    parts = [snapshot.run_dir, *([f"{count} rank{'s' if count > 1 else ''}"] if count else []),
             clock(snapshot.taken_at)]
    driver = snapshot.driver.phase if snapshot.driver else None
    if driver:
        step = f" step {driver.step}" if driver.step is not None else ""
        parts.append(f"driver in {driver.name}{step}")
    if servers:
        parts.append(f"server at {', '.join(servers)}")
    if snapshot.command_exit is not None:
        parts.append(f"command exited {snapshot.command_exit}")
    if blocking:
        ranks = ", ".join(map(str, sorted(blocking)))
        parts.append(f"CUDA_LAUNCH_BLOCKING=1 at the next restart: rank{'s' if len(blocking) > 1 else ''} {ranks}")
    if query:
        parts.append(f"filter: {query}")
    if read_only:
        parts.append("read-only")
    return " · ".join(parts)


def no_ranks_text(snapshot: Snapshot, started_at: float, command: list[str] | None) -> str:
    """Until the first rank's probe file appears; `started_at` is when the TUI began,
    `command` what diag launch runs (None: not known here)."""
    ran = f"the command: {_shortened(command)}\n" if command else ""
    if snapshot.command_exit is not None:
        return f"{ran}the command exited {snapshot.command_exit} before any rank started"
    waited = max(0.0, snapshot.taken_at - started_at)
    return (f"{ran}waiting for the job's ranks to start ({waited:.0f} s): for a process to "
            f"start the probe (a torch.distributed process group, a --mark's first call, "
            f"the engine's or vLLM's workers)")


def _shortened(command: list[str]) -> str:
    text = shlex.join(command)
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 1] + "…"


def as_shown(snapshot: Snapshot) -> Snapshot:
    """The snapshot as the screen shows it: a job that is over at its end (where diag
    began to stop it, else its last heartbeat), so that its ages stop growing."""
    if snapshot.command_exit is None:
        return snapshot
    if snapshot.stop is not None:
        end = snapshot.stop.at
    else:
        states = [*snapshot.ranks.values(), *([snapshot.driver] if snapshot.driver else [])]
        end = max((state.heartbeat_at for state in states), default=snapshot.taken_at)
    return replace(snapshot, taken_at=min(snapshot.taken_at, end))
