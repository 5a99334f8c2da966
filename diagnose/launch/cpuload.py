"""How starved for CPU the ranks and their host are, read by the collector from
/proc (Linux; elsewhere nothing is read and the stall limits stay as they are).

Per rank: the run delay of each of its threads (/proc/PID/task/TID/schedstat,
second field: nanoseconds spent runnable but not running), summed, read at
every snapshot, one sample a second kept for two minutes, so that the analysis can tell how long
a stalled rank waited for a core over exactly the time it stalled.

The host: PSI's cpu "some" share (/proc/pressure/cpu, from its cumulative
`total` over the last ~10 s; the kernel's own avg10 on the first read), and
the 1-minute load average per usable CPU where the kernel has no PSI and in
every case as the figure people know. These go in each verdict's evidence;
docs/architecture.md says why the stretch is the rank's own wait, not these.
"""
from __future__ import annotations

import collections
import os
import time

from diagnose.core.files import read_small
from diagnose.core.snapshot import CpuWait, HostLoad

SAMPLE_S = 1.0        # one run-delay sample kept a second per rank
KEEP_S = 120.0        # samples kept: a stall longer than this is discounted over its last 2 min
PSI_WINDOW_S = 10.0
PSI_FILE = "/proc/pressure/cpu"
SCHEDSTAT_BYTES = 256
PSI_BYTES = 512


class RunDelays:
    """Each local process's run-delay history, keyed by (pid, create time)."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self._kept: dict[tuple, collections.deque[CpuWait]] = {}
        self._shown: dict[tuple, list[CpuWait]] = {}   # the same list until a sample comes

    def history(self, pid: int, create_time: float) -> list[CpuWait]:
        """A sample a second, oldest first, and the one just read last (a wait
        in the last second counts as much as any); snapshots share the list,
        which nobody may modify."""
        key = (pid, create_time)
        kept = self._kept.setdefault(key, collections.deque())
        waited = self._read(pid)
        if waited is None:
            return self.shown(key)
        now = time.time()
        latest = CpuWait(at=now, waited_s=waited)
        if not kept or now - kept[-1].at >= SAMPLE_S:
            kept.append(latest)
            while now - kept[0].at > KEEP_S:
                kept.popleft()
            self._shown[key] = list(kept)
        else:
            self._shown[key] = [*kept, latest]
        return self._shown[key]

    def shown(self, key: tuple) -> list[CpuWait]:
        """What history() last returned for the process."""
        return self._shown.get(key, [])

    def forget_others(self, live: set[tuple]) -> None:
        """Drop the histories of processes no longer in the run dir."""
        for key in self._kept.keys() - live:
            del self._kept[key]
            self._shown.pop(key, None)

    def _read(self, pid: int) -> float | None:
        """Seconds all the process's threads have waited for a CPU, or None."""
        tasks = os.path.join(self.proc, str(pid), "task")
        try:
            threads = os.listdir(tasks)
        except OSError:
            return None
        total, read = 0, False
        for tid in threads:
            try:
                fields = read_small(os.path.join(tasks, tid, "schedstat"), SCHEDSTAT_BYTES).split()
                total += int(fields[1])
                read = True
            except (OSError, ValueError, IndexError):
                continue           # a thread that just ended
        return total / 1e9 if read else None


class HostMeter:
    """The host's CPU pressure over the last PSI_WINDOW_S, and its load per CPU."""

    def __init__(self, psi_file: str = PSI_FILE):
        self.psi_file = psi_file
        self._totals: collections.deque[tuple[float, int]] = collections.deque()

    def read(self) -> HostLoad:
        return HostLoad(load_per_cpu=round(_load_per_cpu(), 3), cpu_pressure=self._pressure())

    def _pressure(self) -> float | None:
        try:
            some = _psi_some(read_small(self.psi_file, PSI_BYTES).decode())
        except (OSError, ValueError, KeyError, UnicodeDecodeError):
            return None
        avg10, total = some
        now = time.monotonic()
        self._totals.append((now, total))
        while len(self._totals) > 2 and now - self._totals[1][0] >= PSI_WINDOW_S:
            self._totals.popleft()
        then, before = self._totals[0]
        if now - then < 1.0:
            return round(avg10 / 100.0, 3)
        return round(min(1.0, (total - before) / 1e6 / (now - then)), 3)


def _psi_some(text: str) -> tuple[float, int]:
    """(avg10, total) of the "some" line; ValueError if there is none."""
    for line in text.splitlines():
        words = line.split()
        if words and words[0] == "some":
            fields = dict(word.split("=", 1) for word in words[1:])
            return float(fields["avg10"]), int(fields["total"])
    raise ValueError("no 'some' line")


def _load_per_cpu() -> float:
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        return os.getloadavg()[0] / max(1, cpus)
    except OSError:
        return 0.0
