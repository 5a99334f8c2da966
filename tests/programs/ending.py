"""A driver that does a little work under the probe and then ends in one of the
ways a healthy (or failing) command's driver ends, or never ends by itself:

  steps   takes a step every 50 ms until a signal ends it
  clean   returns from main (exit 0), like `python -m engine bench`
  fail    exits 3
  raise   ends with an uncaught exception
  zombie  its main thread ends first and its process lingers 2 s before it
          exits 0, silent: what a driver tearing down a CUDA context looks like
          from outside (the leader is a zombie, the exit code not yet known)
"""
import ctypes
import os
import sys
import threading
import time

from diagnose import probe
from diagnose.core.vocab import Phase, Role
from diagnose.probe import recorder

SYS_EXIT = {"x86_64": 60, "aarch64": 93}[os.uname().machine]


class _StopBeating:
    """Stands in for the recorder's `time`: its heartbeat thread ends at its next sleep."""
    time = staticmethod(time.time)

    @staticmethod
    def sleep(seconds):
        raise SystemExit


def end_like_a_zombie() -> None:
    recorder.time = _StopBeating
    time.sleep(0.3)
    threading.Thread(target=lambda: (time.sleep(2.0), os._exit(0))).start()
    ctypes.CDLL(None).syscall(SYS_EXIT, 0)   # this thread only, not the process


def main(how: str) -> int:
    probe.init(Role.DRIVER)
    for step in range(10**9 if how == "steps" else 5):
        with probe.phase(Phase.SCHEDULE, step=step):
            time.sleep(0.05)
    if how == "zombie":
        end_like_a_zombie()
    if how == "raise":
        raise RuntimeError("the driver failed")
    return 3 if how == "fail" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
