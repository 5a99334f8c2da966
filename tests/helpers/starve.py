"""A host starved for CPU: busy-loop processes, each in a session of its own (so
that the kernel's autogroups give each the share an independent job would
get), started by the test and always ended with it."""
from __future__ import annotations

import os
import subprocess
import sys
import time

# Ends by itself once its parent is gone, should the test die before it can kill it.
BUSY_LOOP = "import os\nparent = os.getppid()\nwhile os.getppid() == parent: pass"
PSI_FILE = "/proc/pressure/cpu"


def cpus() -> int:
    return len(os.sched_getaffinity(0))


class Starved:
    """`per_cpu` busy loops per usable CPU while the block runs."""

    def __init__(self, per_cpu: int = 4):
        self.count = per_cpu * cpus()
        self.procs: list[subprocess.Popen] = []
        self.began = (0.0, None)

    def __enter__(self) -> Starved:
        self.began = (time.monotonic(), psi_some_total())
        self.procs = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP],
                                       start_new_session=True) for _ in range(self.count)]
        return self

    def __exit__(self, *exc) -> None:
        for proc in self.procs:
            proc.kill()
        for proc in self.procs:
            proc.wait()

    def pressure(self) -> float | None:
        """PSI's cpu "some" share since the block began (None without PSI)."""
        began, total = self.began
        now = psi_some_total()
        if total is None or now is None:
            return None
        return (now - total) / 1e6 / max(1e-6, time.monotonic() - began)


def psi_some_total() -> int | None:
    """The cumulative microseconds of PSI's cpu "some" line; None without PSI."""
    try:
        with open(PSI_FILE) as psi:
            line = psi.readline()
    except OSError:
        return None
    return int(line.rsplit("total=", 1)[1]) if "total=" in line else None
