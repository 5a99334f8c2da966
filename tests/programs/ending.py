"""A driver that does a little work under the probe, then ends in one of the
ways a command's driver ends, or never ends by itself:

  steps   takes a step every 50 ms until a signal ends it
"""
import sys
import time

from diagnose import probe
from diagnose.core.vocab import Phase, Role


def main(how: str) -> int:
    probe.init(Role.DRIVER)
    for step in range(10**9 if how == "steps" else 5):
        with probe.phase(Phase.SCHEDULE, step=step):
            time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
