"""Fault kernels: a GPU hang that can be released, and a device-side assert.

`gpu_spin` polls a flag in pinned host memory, which the GPU reads through
unified addressing (zero-copy): the kernel runs until the host sets the flag,
so the stream behind it stalls while the host runs on. `device_assert` fails a
`tl.device_assert`, which poisons the CUDA context: the error surfaces at a
later, unrelated call unless CUDA_LAUNCH_BLOCKING=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _spin_kernel(flag_ptr):
    # A volatile load reads host memory each time round; the loop ends when the
    # host writes a non-zero value.
    done = tl.load(flag_ptr, volatile=True)
    while done == 0:
        done = tl.load(flag_ptr, volatile=True)


@triton.jit(debug=True)
def _assert_kernel(x_ptr):
    x = tl.load(x_ptr)
    tl.device_assert(x == 0, "diag fault: device_assert")


def spin_flag() -> torch.Tensor:
    """A zeroed int32 in pinned host memory, for gpu_spin and release."""
    return torch.zeros(1, dtype=torch.int32, pin_memory=True)


def gpu_spin(flag: torch.Tensor) -> None:
    """Launch the spin kernel on the current stream and return at once."""
    _spin_kernel[(1,)](flag)


def release(flag: torch.Tensor) -> None:
    """Let the spinning kernel end."""
    flag.fill_(1)


def device_assert(device: torch.device | str = "cuda") -> None:
    """Launch a kernel whose assert fails; returns before it fails (unless
    CUDA_LAUNCH_BLOCKING=1, when the launch itself raises)."""
    _assert_kernel[(1,)](torch.ones(1, dtype=torch.int32, device=device))
