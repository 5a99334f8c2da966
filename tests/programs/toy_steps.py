"""The steps of the test programs, in a module of their own so `--mark
toy_steps:train_step` has something to wrap (a script runs as __main__).

TOY_FAULT=KIND:RANK:STEP injects one fault, read by the programs themselves:
  skip_allreduce  the rank skips the step's gradient all_reduce and goes on to
                  slow work of its own (an evaluation only it runs)
  skip_once       the rank skips the step's gradient all_reduce and trains on:
                  each of its calls pairs with its peers' next one, up to the last
  exit            the rank exits with code 3
  no_send         the pipeline stage receives its input but never sends its output
  late_start      the rank stalls before its first step
"""
import os
import time

import torch
import torch.distributed as dist

STALL_S = 60.0   # long past every detection limit; diag launch ends the run first


def fault_here(kind: str, step: int | None = None) -> bool:
    spec = os.environ.get("TOY_FAULT", "")
    if not spec:
        return False
    fault_kind, rank, fault_step = spec.split(":")
    return (fault_kind == kind and int(rank) == dist.get_rank()
            and (step is None or int(fault_step) == step))


def train_step(model: torch.nn.Module, step: int) -> float:
    inputs = torch.randn(16, 8)
    loss = model(inputs).pow(2).mean()
    model.zero_grad()
    loss.backward()
    if fault_here("exit", step):
        os._exit(3)
    grads = torch.cat([param.grad.flatten() for param in model.parameters()])
    if fault_here("skip_allreduce", step):
        time.sleep(STALL_S)
    elif not fault_here("skip_once", step):
        dist.all_reduce(grads)
    grads /= dist.get_world_size()
    with torch.no_grad():
        offset = 0
        for param in model.parameters():
            param -= 0.01 * grads[offset:offset + param.numel()].view_as(param)
            offset += param.numel()
    return loss.item()


def stage_step(step: int, activation: torch.Tensor) -> torch.Tensor:
    """One microbatch through this rank's pipeline stage: receive from the
    previous stage, compute, send to the next."""
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, activation, rank - 1)]):
            work.wait()
    output = torch.tanh(activation * 1.5 + step)
    if fault_here("no_send", step):
        time.sleep(STALL_S)
    if rank < world - 1:
        for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, output, rank + 1)]):
            work.wait()
    return output
