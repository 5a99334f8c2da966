"""judged.json: diag launch's latest verdicts, written again each time they
change (a new kind or culprit), so that `diag tui` opened on the run dir later
shows the launcher's answer at once, before it has read and judged every rank
itself (seconds at 16,384 ranks)."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

from diagnose.core.checked import checked
from diagnose.core.files import read_small
from diagnose.core.schema import Document, read_version, stamped
from diagnose.core.snapshot import Snapshot, Verdict

NAME = str(Document.JUDGED)
PART = NAME + ".part"          # written, then renamed: a reader sees one whole judgment
MAX_BYTES = 64 << 20           # 16,384 victims with their states in evidence: about 2 MB


@dataclass
class LaunchJudgment:
    taken_at: float             # the snapshot the verdicts were made on
    verdicts: list[Verdict]     # an agent's are its head's, as its own view shows them


def write(run_dir: str, snapshot: Snapshot, verdicts: list[Verdict]) -> None:
    body = {"taken_at": snapshot.taken_at, "verdicts": [asdict(verdict) for verdict in verdicts]}
    path = os.path.join(run_dir, PART)
    with open(path, "w") as sink:
        sink.write(json.dumps(stamped(Document.JUDGED, body), default=str))
    os.replace(path, os.path.join(run_dir, NAME))


class Reader:
    """judged.json read again only when it changed: the TUI asks at every poll."""

    def __init__(self, run_dir: str):
        self.run_dir = run_dir
        self.seen: tuple | None = None       # (size, mtime) of the file last read
        self.last: LaunchJudgment | None = None

    def read(self) -> LaunchJudgment | None:
        try:
            info = os.stat(os.path.join(self.run_dir, NAME))
        except OSError:
            return None
        if (info.st_size, info.st_mtime_ns) != self.seen:
            self.seen, self.last = (info.st_size, info.st_mtime_ns), read(self.run_dir)
        return self.last


def read(run_dir: str) -> LaunchJudgment | None:
    """The launcher's latest judgment; None where there is none or it cannot be
    read whole (the reader then judges for itself, as it would without it)."""
    try:
        return checked(LaunchJudgment, read_version(Document.JUDGED, json.loads(
            read_small(os.path.join(run_dir, NAME), MAX_BYTES))))
    except (OSError, ValueError):
        return None
