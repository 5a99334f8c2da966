"""Steps of all_reduce on NCCL, run by torchrun, for the Flight Recorder on a GPU
(benchmarks/gpu_flight_recorder.py). NCCL_HANG=RANK:STEP makes that rank's GPU
spin for minutes before the step's all_reduce (nccl_steps.step): its host waits
in synchronize, and on two or more ranks the others wait for it in theirs."""
import os
import time

import torch
import torch.distributed as dist

import nccl_steps

STEPS = 10_000
STEP_S = 0.02


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    spec = os.environ.get("NCCL_HANG", "")
    hang_rank, hang_step = map(int, spec.split(":")) if spec else (-1, -1)
    x = torch.ones(1 << 20, device="cuda")
    for index in range(STEPS):
        x.fill_(1.0)
        nccl_steps.step(x, rank == hang_rank and index == hang_step)
        time.sleep(STEP_S)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
