"""Fault injection for tests and demos: DIAG_FAULT="rank=R,at=PHASE[,step=N|all],kind=K;...".

A fault fires once, just before its rank enters phase `at`: the first time, or
the first time with step argument N; with step=all it fires on every entry
(kind=sleep:S with step=all makes a straggler). Kinds:

  hang             block forever (the heartbeat thread keeps beating)
  spin             loop forever on the CPU: a hang that computes (and waits for a core)
  sleep:SECONDS    block that long, then go on (a straggler)
  crash            SIGKILL self
  exit:CODE        exit at once with CODE, no clean-up
  skip_collective  the next traced collective is not made and takes no sequence number
  skip_broadcast   enter the phase (use at=dequeue) and block there, never reading
                   the broadcast ring: the rank stops consuming the driver's messages
  raise            enter the phase and raise FaultRaised (a RuntimeError) inside it:
                   the phase ends in an exception, as a bug in its code would end it
  gpu_spin         launch a kernel that spins forever on the stream, go on: the GPU is stuck
  device_assert    launch a kernel whose device-side assert fails and go on: the
                   CUDA error surfaces at a later call

`rank` is a rank number, or `driver` for the driver process.
"""
from __future__ import annotations

import math
import os
import signal
import time
from dataclasses import dataclass

from diagnose.core.vocab import DRIVER_PHASES, STARTUP_PHASES, STEP_PHASES, FaultKind

ENV_VAR = "DIAG_FAULT"
INSIDE_KINDS = (FaultKind.SKIP_BROADCAST, FaultKind.RAISE)   # they act once their phase is open
KNOWN_PHASES = tuple(dict.fromkeys(STARTUP_PHASES + STEP_PHASES + DRIVER_PHASES))
SPIN_FLAGS: list = []  # the host flags of gpu_spin kernels launched here (kernels.faults.release)
FORMAT = "rank=R,at=PHASE[,step=N|all],kind=K"


class FaultRaised(RuntimeError):
    """What kind=raise raises inside its phase."""


class FaultSpecError(ValueError):
    """A fault spec that cannot be parsed; the message names the problem."""


@dataclass(frozen=True)
class FaultSpec:
    rank: int | None          # None: the driver
    at: str
    kind: FaultKind
    step: int | None = None
    arg: float | None = None  # sleep: seconds, exit: the exit code
    every: bool = False       # step=all: fire on every entry of the phase

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        fields = _fields(text)
        missing = [key for key in ("rank", "at", "kind") if key not in fields]
        if missing:
            raise FaultSpecError(f"fault spec {text!r}: missing {', '.join(missing)} "
                                 f"(expected {FORMAT})")
        kind, arg = _kind(text, fields["kind"])
        every = fields.get("step") == "all"
        return cls(rank=_rank(text, fields["rank"]), at=_phase(text, fields["at"]), kind=kind,
                   step=None if every else _step(text, fields.get("step")), arg=arg, every=every)

    def __str__(self) -> str:
        rank = "driver" if self.rank is None else str(self.rank)
        step = ",step=all" if self.every else "" if self.step is None else f",step={self.step}"
        kind = str(self.kind)
        if self.kind == FaultKind.SLEEP:
            kind = f"sleep:{self.arg:g}"
        elif self.kind == FaultKind.EXIT:
            kind = f"exit:{int(self.arg)}"
        return f"rank={rank},at={self.at}{step},kind={kind}"


def parse_faults(text: str) -> list[FaultSpec]:
    """Several specs separated by ';' (empty parts are ignored)."""
    return [FaultSpec.parse(part) for part in text.split(";") if part.strip()]


def _fields(text: str) -> dict[str, str]:
    fields = {}
    for item in text.strip().split(","):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not value:
            raise FaultSpecError(f"fault spec {text!r}: {item.strip()!r} is not key=value "
                                 f"(expected {FORMAT})")
        if key not in ("rank", "at", "step", "kind"):
            raise FaultSpecError(f"fault spec {text!r}: unknown key {key!r} (expected {FORMAT})")
        if key in fields:
            raise FaultSpecError(f"fault spec {text!r}: {key} given twice")
        fields[key] = value
    return fields


def _rank(text: str, value: str) -> int | None:
    if value == "driver":
        return None
    if not value.isdigit():
        raise FaultSpecError(f"fault spec {text!r}: rank must be a number >= 0 or 'driver', "
                             f"not {value!r}")
    return int(value)


def _phase(text: str, value: str) -> str:
    if value not in KNOWN_PHASES:
        raise FaultSpecError(f"fault spec {text!r}: unknown phase {value!r} "
                             f"(known: {', '.join(KNOWN_PHASES)})")
    return value


def _step(text: str, value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit():
        raise FaultSpecError(f"fault spec {text!r}: step must be a number >= 0, not {value!r}")
    return int(value)


def _kind(text: str, value: str) -> tuple[FaultKind, float | None]:
    name, _, arg = value.partition(":")
    if name not in set(FaultKind):
        raise FaultSpecError(f"fault spec {text!r}: unknown kind {name!r} "
                             f"(known: hang, spin, sleep:SECONDS, crash, exit:CODE, "
                             f"skip_collective, skip_broadcast, raise, gpu_spin, device_assert)")
    kind = FaultKind(name)
    if kind == FaultKind.SLEEP:
        try:
            seconds = float(arg)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds < math.inf:
            raise FaultSpecError(f"fault spec {text!r}: sleep needs a finite number of seconds "
                                 f"> 0, as in kind=sleep:2.5 (kind=hang blocks forever)")
        return kind, seconds
    if kind == FaultKind.EXIT:
        if not arg.isdigit() or int(arg) > 255:
            raise FaultSpecError(f"fault spec {text!r}: exit needs a code 0..255, "
                                 f"as in kind=exit:3")
        return kind, int(arg)
    if arg:
        raise FaultSpecError(f"fault spec {text!r}: kind {kind} takes no argument")
    return kind, None


class FaultPlan:
    """The faults armed in one process: the phase entry each fires at, and what
    each kind does there. `record` is called with a spec as it fires, before it acts."""

    def __init__(self, specs: list[FaultSpec], record=lambda spec: None):
        self.armed: dict[str, list[FaultSpec]] = {}
        for spec in specs:
            self.armed.setdefault(spec.at, []).append(spec)
        self.record = record
        self.skip_next_collective = False

    def due(self, phase: str, step: int | None) -> FaultSpec | None:
        """The fault to fire on this entry of `phase`, now disarmed; None if none."""
        specs = self.armed.get(phase)
        if not specs:
            return None
        for spec in specs:
            if spec.every:
                return spec
            if spec.step is None or spec.step == step:
                specs.remove(spec)
                if not specs:
                    del self.armed[phase]
                return spec
        return None

    def before_phase(self, phase: str, step: int | None) -> FaultSpec | None:
        """Fires the fault due at this entry of `phase`, if any, and returns it."""
        spec = self.due(phase, step)
        if spec is None:
            return None
        self.record(spec)
        if spec.kind == FaultKind.SKIP_COLLECTIVE:
            self.skip_next_collective = True
        elif spec.kind not in INSIDE_KINDS:
            _ACTS[spec.kind](spec)
        return spec

    @staticmethod
    def inside_phase(spec: FaultSpec) -> None:
        """skip_broadcast blocks once its phase is open: the rank sits in dequeue;
        raise raises there."""
        if spec.kind == FaultKind.SKIP_BROADCAST:
            block_forever()
        elif spec.kind == FaultKind.RAISE:
            raise FaultRaised(f"diag fault {spec}: raised inside {spec.at}")


def block_forever() -> None:
    while True:
        time.sleep(1.0)


def _gpu_spin(spec: FaultSpec) -> None:
    from kernels import faults as fault_kernels  # Triton and CUDA only for the GPU kinds
    flag = fault_kernels.spin_flag()
    SPIN_FLAGS.append(flag)  # the kernel reads it until released: it must stay allocated
    fault_kernels.gpu_spin(flag)


def _device_assert(spec: FaultSpec) -> None:
    from kernels import faults as fault_kernels
    fault_kernels.device_assert()


_ACTS = {
    FaultKind.HANG: lambda spec: block_forever(),
    FaultKind.SPIN: lambda spec: spin_forever(),
    FaultKind.SLEEP: lambda spec: time.sleep(spec.arg),
    FaultKind.CRASH: lambda spec: os.kill(os.getpid(), signal.SIGKILL),
    FaultKind.EXIT: lambda spec: os._exit(int(spec.arg)),
    FaultKind.GPU_SPIN: _gpu_spin,
    FaultKind.DEVICE_ASSERT: _device_assert,
}


def spin_forever() -> None:
    while True:
        pass
