"""What diag says while it waits, once each: a command none of whose processes
has started the probe after WAITING_S, and a --mark armed WAITING_S ago in some
process but not called yet. Silence there reads as a hang of diag's own."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from diagnose.core.snapshot import Snapshot
from diagnose.probe import marks

WAITING_S = 10.0


@dataclass
class Waiting:
    mark_texts: list[str]
    run_dir: str
    started: float = field(default_factory=time.time)
    said: set[str] = field(default_factory=set)

    def lines(self, snapshot: Snapshot) -> list[str]:
        """What is new to say now; empty once everything has been said or started.
        The phases the ranks have entered are looked for only while a --mark is
        unsaid (at 16,384 ranks, a pass over every rank's phases at each poll)."""
        now = time.time()
        if now - self.started < WAITING_S:
            return []
        found = []
        if not snapshot.ranks and snapshot.driver is None and "probe" not in self.said:
            self.said.add("probe")
            found.append(f"no process of the command has started the probe after "
                         f"{WAITING_S:.0f} s; waiting for {self._what_starts_it()}")
        unsaid = [mark for mark in map(marks.parse_mark, self.mark_texts)
                  if str(mark) not in self.said]
        phases_seen = phase_names(snapshot) if unsaid else set()
        pending = [mark for mark in unsaid if mark.phase not in phases_seen]
        for mark, at in (marks.armed_at(self.run_dir) if pending else {}).items():
            if mark in self.said or now - at < WAITING_S:
                continue
            if marks.parse_mark(mark).phase not in phases_seen:
                self.said.add(mark)
                found.append(f"--mark {mark}: armed {now - at:.0f} s ago, not called yet")
        return found

    def _what_starts_it(self) -> str:
        starts = [f"a first call of --mark {text}" for text in self.mark_texts]
        starts += ["a torch.distributed process group", "the engine's or vLLM's workers"]
        return ", ".join(starts[:-1]) + f" or {starts[-1]}"


def phase_names(snapshot: Snapshot) -> set[str]:
    """Every phase a rank or the driver has entered."""
    states = list(snapshot.ranks.values()) + ([snapshot.driver] if snapshot.driver else [])
    return {event.name for state in states for event in state.phases + state.open_phases}
