"""The step of tests/programs/nccl_loop.py, in a module of its own so that `--mark
nccl_steps:step` has something to wrap (a script runs as __main__)."""
import torch
import torch.distributed as dist

SPIN_CYCLES = 600 * 2_000_000_000   # some minutes of one SM at ~2 GHz


def step(x: torch.Tensor, hang: bool) -> None:
    """One all_reduce on NCCL, waited for; with hang, the GPU spins first, so the
    all_reduce is enqueued behind the spin and never starts."""
    if hang:
        torch.cuda._sleep(SPIN_CYCLES)
    dist.all_reduce(x)
    torch.cuda.synchronize()
