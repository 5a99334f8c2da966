"""The status line under the verdict, and what the grid says while the job has
no rank yet."""
from __future__ import annotations

import time

from diagnose.core.snapshot import Snapshot


def status_text(snapshot: Snapshot, blocking: set[int], query: str, servers: list[str],
                read_only: bool) -> str:
    parts = [snapshot.run_dir, *([f"{len(snapshot.ranks)} ranks"] if snapshot.ranks else []),
             time.strftime("%H:%M:%S UTC", time.gmtime(snapshot.taken_at))]
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


def no_ranks_text(snapshot: Snapshot, started_at: float) -> str:
    """Until the first rank's probe file appears; `started_at` is when the TUI began."""
    if snapshot.command_exit is not None:
        return f"the command exited {snapshot.command_exit} before any rank started"
    waited = max(0.0, snapshot.taken_at - started_at)
    return f"waiting for the job's ranks to start ({waited:.0f} s)"
