"""Two probed ranks (tp=2, no torch: they start in well under a second), run by
this parent, which is no rank. Each takes steps of 50 ms and prints one line.

  clean   5 steps each, then both end normally (exit 0)
  hang    rank 1 blocks inside its step 2 for ever; rank 0 waits for work
  serve   prints where it listens (as a server does), then steps until a signal
"""
import subprocess
import sys
import time

from diagnose import probe
from diagnose.core.vocab import Phase, Role

STEP_S = 0.05
ADDRESS = "http://127.0.0.1:8765"


def rank_main(rank: int, how: str) -> None:
    probe.init(Role.WORKER, rank=rank, world_size=2, tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1)
    steps = 5 if how == "clean" else 10**9
    for step in range(steps):
        if how == "hang" and rank == 0 and step == 2:
            with probe.phase(Phase.DEQUEUE, step=step):
                time.sleep(10**6)
        with probe.phase(Phase.EXECUTE_MODEL, step=step):
            time.sleep(10**6 if how == "hang" and rank == 1 and step == 2 else STEP_S)
    print(f"rank {rank}: {steps} steps done", flush=True)


def main(how: str) -> int:
    if how == "serve":
        print(f"serving two ranks on {ADDRESS}", flush=True)
    ranks = [subprocess.Popen([sys.executable, __file__, how, str(rank)]) for rank in range(2)]
    return max(rank.wait() for rank in ranks)


if __name__ == "__main__":
    sys.exit(rank_main(int(sys.argv[2]), sys.argv[1]) if len(sys.argv) > 2 else main(sys.argv[1]))
