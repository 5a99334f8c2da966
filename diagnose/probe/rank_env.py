"""Per-rank settings that `diag launch` asks for and each rank applies to itself
at probe.init, before CUDA or NCCL start: CUDA_LAUNCH_BLOCKING on chosen ranks,
and NCCL debug output to a file per rank in the run dir."""
from __future__ import annotations

import os

from diagnose.core import layout

LAUNCH_BLOCKING_VAR = "DIAG_LAUNCH_BLOCKING"   # "all" or "0,3"
NCCL_DEBUG_VAR = "DIAG_NCCL_DEBUG"             # an NCCL_DEBUG level: WARN, INFO, TRACE


def parse_ranks(text: str) -> set[int] | None:
    """"all" -> None (every rank); "0,3" -> {0, 3}; "0-3" -> {0, 1, 2, 3}. Raises ValueError."""
    if text == "all":
        return None
    try:
        return layout.parse_ranks(text)
    except ValueError as error:
        raise ValueError(f"--launch-blocking takes 'all' or ranks like 0,3 or 0-3; {error}") from None


def apply(run_dir: str, rank: int | None) -> None:
    blocking = os.environ.get(LAUNCH_BLOCKING_VAR)
    if blocking and rank is not None:
        ranks = parse_ranks(blocking)
        if ranks is None or rank in ranks:
            os.environ["CUDA_LAUNCH_BLOCKING"] = "1"
    level = os.environ.get(NCCL_DEBUG_VAR)
    if level:
        os.environ["NCCL_DEBUG"] = level
        name = "driver" if rank is None else f"rank-{rank}"
        os.environ["NCCL_DEBUG_FILE"] = os.path.join(run_dir, f"nccl-{name}.log")
