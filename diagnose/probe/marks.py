"""--mark module:Qualified.name[=phase]: calls of a function become a probe phase.

`diag launch` passes the marks to every process in MARKS_VAR; each process
wraps the function when its module is imported, and counts its calls as the
phase's steps (0, 1, ...). A mark whose function does not exist is reported
once on stderr and the run goes on.
"""
from __future__ import annotations

import functools
import os
import sys
from dataclasses import dataclass

from diagnose import probe
from diagnose.probe import torch_dist

MARKS_VAR = "DIAG_MARKS"       # marks separated by ';'
PHASE_NAME_BYTES = 32          # the probe file's phase name field


class MarkSpecError(ValueError):
    """A --mark that is not module:Qualified.name[=phase]."""


@dataclass(frozen=True)
class Mark:
    module: str
    qualname: str
    phase: str

    def __str__(self):
        return f"{self.module}:{self.qualname}={self.phase}"


def parse_mark(text: str) -> Mark:
    target, _, phase = text.partition("=")
    module, _, qualname = target.partition(":")
    if not module or not qualname or not all(part.isidentifier() for part in
                                             module.split(".") + qualname.split(".")):
        raise MarkSpecError(f"--mark takes module:Qualified.name[=phase], not {text!r}")
    phase = phase or qualname.rsplit(".", 1)[-1]
    if len(phase.encode()) > PHASE_NAME_BYTES:
        raise MarkSpecError(f"--mark phase name {phase!r} is longer than {PHASE_NAME_BYTES} bytes")
    return Mark(module, qualname, phase)


def install() -> None:
    """Arm the marks named in MARKS_VAR."""
    for text in filter(None, os.environ.get(MARKS_VAR, "").split(";")):
        mark = parse_mark(text)
        torch_dist.on_import(mark.module, functools.partial(apply, mark))


def apply(mark: Mark, module) -> None:
    owner, parts = module, mark.qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part, None)
    function = getattr(owner, parts[-1], None) if owner is not None else None
    if not callable(function):
        print(f"diag: --mark {mark.module}:{mark.qualname}: {mark.module} has no "
              f"{mark.qualname}; mark ignored", file=sys.stderr)
        return
    setattr(owner, parts[-1], _as_phase(function, mark.phase))


def _as_phase(function, phase: str):
    calls = 0

    @functools.wraps(function)
    def marked(*args, **kwargs):
        nonlocal calls
        step, calls = calls, calls + 1
        with probe.phase(phase, step=step):
            return function(*args, **kwargs)
    return marked
