"""Two ranks of a real gloo job (tp=2) whose all-reduce the probe cannot see, as
in vLLM's compiled model: each step is an execute_model phase around a c10d
functional all_reduce (torch.distributed's functional ops are not traced).
Rank 0 misbehaves inside its step 3:

  sleep    sleeps there for ever: rank 1 waits in the all_reduce
  raise    raises there; the program catches it, as vLLM's worker does, and
           rank 0 goes back to waiting for work, for ever
  compile  runs a real torch.compile of a new function there (Dynamo, Inductor's
           C++ build in a subprocess), then goes on: 8 steps, both end with 0
  clean    8 steps each, then both end with 0

Run by this parent, which is no rank: python gloo_states.py MODE
"""
import datetime
import os
import subprocess
import sys
import time

STEPS = 8
BAD_STEP = 3


def misbehave(how: str) -> None:
    if how == "sleep":
        while True:
            time.sleep(1.0)
    if how == "raise":
        raise RuntimeError("rank 0 failed inside its step (gloo_states raise)")
    if how == "compile":
        import torch

        def new_shape(x):
            for i in range(8):
                x = torch.sin(x) * 1.5 + torch.cos(x + i)
            return x.sum()
        torch.compile(new_shape)(torch.randn(128))


def wait_for_work_forever() -> None:
    from diagnose import probe
    from diagnose.core.vocab import Phase
    with probe.phase(Phase.DEQUEUE, step=BAD_STEP + 1):
        while True:
            time.sleep(0.05)


def rank_main(rank: int, how: str, port: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    from diagnose import probe
    from diagnose.core.vocab import Phase, Role

    probe.init(Role.WORKER, rank=rank, world_size=2, tp_rank=rank, tp_size=2, pp_rank=0,
               pp_size=1, groups={"tp0": [0, 1]})
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=600))
    fc.all_reduce(torch.ones(1), "sum", dist.group.WORLD).wait()  # its lazy imports, once
    for step in range(STEPS):
        try:
            with probe.phase(Phase.EXECUTE_MODEL, step=step):
                if rank == 0 and step == BAD_STEP:
                    misbehave(how)
                total = fc.all_reduce(torch.ones(4) * (step + 1), "sum", dist.group.WORLD)
                total.wait()
                time.sleep(0.05)
        except RuntimeError:
            wait_for_work_forever()
    print(f"rank {rank}: {STEPS} steps done", flush=True)
    dist.destroy_process_group()


def main(how: str) -> int:
    port = str(20000 + os.getpid() % 20000)
    ranks = [subprocess.Popen([sys.executable, __file__, how, str(rank), port])
             for rank in range(2)]
    return max(rank.wait() for rank in ranks)


if __name__ == "__main__":
    if len(sys.argv) > 2:
        rank_main(int(sys.argv[2]), sys.argv[1], sys.argv[3])
    else:
        sys.exit(main(sys.argv[1]))
