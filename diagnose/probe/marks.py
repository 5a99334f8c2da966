"""--mark module:Qualified.name[=phase]: calls of a function become a probe phase.

`diag launch` passes the marks to every process in MARKS_VAR; each process
wraps the function when its module is imported, and counts its calls as the
phase's steps (0, 1, ...). A mark whose function does not exist is reported
once on stderr and the run goes on. Each process that armed a mark adds a
line to `marks.jsonl` in the run dir, so the launcher can say at the end which
marks never met their module.

A call that torch.compile's Dynamo traces is passed straight through: a probe
call there would change what Dynamo traces (fullgraph capture fails on it).
Such calls are not recorded; once compiled, the function body runs as a graph
and the wrapper is not called at all.

A process that is no rank of a torch.distributed job (no RANK in its
environment, no process group) becomes rank 0 of 1 at its first marked call:
a plain Python program is watched through its marks alone. One process of a
run at most does so (the first to take ALONE_CLAIM in the run dir).

A marked method stays a method whose first parameter is named `self`: vLLM's
compile wrapper (without its AOT cache) finds its module in the traced frame's
local `self`. A staticmethod or classmethod stays one.
"""
from __future__ import annotations

import functools
import inspect
import json
import os
import sys
import time
from dataclasses import dataclass

from diagnose import probe
from diagnose.core.schema import Document, read_version, stamped
from diagnose.core.vocab import Role
from diagnose.probe import torch_dist

MARKS_VAR = "DIAG_MARKS"       # marks separated by ';'
ARMED_FILE = "marks.jsonl"     # in the run dir: {"mark": ..., "pid": ...} per armed mark
PHASE_NAME_BYTES = 32          # the probe file's phase name field
ALONE_CLAIM = "marked-process.claim"   # in the run dir: the process that is rank 0 of 1


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
    name = parts[-1]
    if owner is None or not callable(getattr(owner, name, None)):
        print(f"diag: --mark {mark.module}:{mark.qualname}: {mark.module} has no "
              f"{mark.qualname}; mark ignored", file=sys.stderr)
        return
    setattr(owner, name, _marked(owner, name, _Phase(mark.phase, _compiling_check())))
    _note_armed(mark)


def _marked(owner, name: str, phase: _Phase):
    """What replaces owner.name: the same kind of attribute, each call a phase."""
    raw = inspect.getattr_static(owner, name)
    if isinstance(raw, (staticmethod, classmethod)):
        return type(raw)(_as_function_phase(raw.__func__, phase))
    if inspect.isclass(owner) and inspect.isfunction(raw):
        return _as_method_phase(raw, phase)
    return _as_function_phase(getattr(owner, name), phase)


class _Phase:
    """One mark's calls: the phase each one is, numbered 0, 1, ..."""

    def __init__(self, name: str, compiling):
        self.name = name
        self.compiling = compiling
        self.calls = 0

    def run(self, function, args, kwargs):
        if self.compiling():
            return function(*args, **kwargs)
        if not probe.is_on():
            _start_alone()
        step, self.calls = self.calls, self.calls + 1
        with probe.phase(self.name, step=step):
            return function(*args, **kwargs)


def _as_function_phase(function, phase: _Phase):
    @functools.wraps(function)
    def marked(*args, **kwargs):
        return phase.run(function, args, kwargs)
    return marked


def _as_method_phase(function, phase: _Phase):
    @functools.wraps(function)
    def marked(self, *args, **kwargs):
        return phase.run(function, (self, *args), kwargs)
    return marked


def _start_alone() -> None:
    """The probe of a process outside any torch.distributed job, as rank 0 of 1."""
    run_dir = os.environ.get(probe.RUN_DIR_VAR)
    if not run_dir or "RANK" in os.environ or _in_process_group():
        return
    try:
        os.close(os.open(os.path.join(run_dir, ALONE_CLAIM), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except OSError:
        return                  # another process of the run is rank 0 already
    try:
        probe.init(role=Role.PROCESS, rank=0, world_size=1, groups={"world": [0]})
    except Exception as error:  # the host program runs on without its probe
        print(f"diag: --mark: the probe could not start in this process: {error!r}",
              file=sys.stderr)


def _in_process_group() -> bool:
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized())
    except Exception:           # a torch we cannot ask: leave the probe to its process group
        return True


def _compiling_check():
    """torch.compiler.is_compiling where torch is loaded (Dynamo folds it to True
    while it traces), else a function that says no."""
    compiler = getattr(sys.modules.get("torch"), "compiler", None)
    return getattr(compiler, "is_compiling", None) or (lambda: False)


def _note_armed(mark: Mark) -> None:
    run_dir = os.environ.get(probe.RUN_DIR_VAR)
    if not run_dir:
        return
    line = json.dumps(stamped(Document.MARK, {"mark": str(mark), "pid": os.getpid(),
                                              "at": time.time()})) + "\n"
    try:
        with open(os.path.join(run_dir, ARMED_FILE), "a") as sink:
            sink.write(line)
    except OSError:
        pass                    # the run dir is the launcher's: a note it misses is all


def notes(texts: list[str], run_dir: str, phases_seen: set[str]) -> list[str]:
    """What the launcher says at the end about the run's marks: those whose module
    no process imported, and those armed that left no phase in the ranks' files."""
    armed, found = armed_at(run_dir), []
    for mark in map(parse_mark, texts):
        if str(mark) not in armed:
            found.append(f"--mark {mark}: no process of the job imported {mark.module}; "
                         f"the mark never fired")
        elif mark.phase not in phases_seen:
            found.append(f"--mark {mark}: armed, but no call of it is in the ranks' recent "
                         f"phases; calls made while torch.compile traces it are passed "
                         f"through unrecorded, and once compiled its body runs as a graph")
    return found


def armed_at(run_dir: str) -> dict[str, float]:
    """The marks some process of the run armed, and when the first one did (0.0 where
    the line says not)."""
    try:
        with open(os.path.join(run_dir, ARMED_FILE)) as source:
            lines = source.readlines(1 << 20)
    except OSError:
        return {}
    armed: dict[str, float] = {}
    for line in lines:
        try:
            body = read_version(Document.MARK, json.loads(line))
            mark, at = str(body["mark"]), float(body.get("at", 0.0))
        except (ValueError, KeyError, TypeError):
            continue
        armed[mark] = min(armed.get(mark, at), at)
    return armed
