"""A pipeline loop, run by torchrun with one stage per rank: each microbatch
goes stage to stage through batch_isend_irecv. Faults: toy_steps."""
import time

import torch
import torch.distributed as dist

import toy_steps

STEPS = 40
STEP_S = 0.05


def main():
    dist.init_process_group("gloo")
    activation = torch.zeros(4, 8)
    for step in range(STEPS):
        toy_steps.stage_step(step, activation)
        time.sleep(STEP_S)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
