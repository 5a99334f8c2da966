"""A data-parallel training loop, run by torchrun: every rank trains a copy of
a small model and averages its gradients with all_reduce. Faults: toy_steps."""
import os
import time

import torch
import torch.distributed as dist

import toy_steps

STEPS = int(os.environ.get("TOY_STEPS", "40"))
STEP_S = float(os.environ.get("TOY_STEP_S", "0.05"))   # a sleep after each step


def main():
    dist.init_process_group("gloo")
    if toy_steps.fault_here("late_start"):
        time.sleep(toy_steps.STALL_S)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    for step in range(STEPS):
        toy_steps.train_step(model, step)
        time.sleep(STEP_S)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
