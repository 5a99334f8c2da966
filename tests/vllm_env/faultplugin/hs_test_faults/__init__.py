"""Faults inside a real vLLM worker's step, for hangscope's tests: a vLLM general
plugin, inert unless HS_TEST_FAULT is set.

    HS_TEST_FAULT="rank=1,call=3,kind=sleep[,after=PATH][,dp=D][;rank=2,call=3,kind=assert...]"

On the worker of rank `rank` in DP rank `dp` (default 0: vLLM numbers each DP
rank's workers from 0), at its `call`-th Worker.execute_model (1 is
the first), before vLLM's own execute_model runs. With `after`, a test picks
the moment: the first worker to find the file PATH at a call (from the
`call`-th on) that has tokens to run writes down the next call, and every
fault of that PATH fires at the first call from that one on that has tokens
(with pp > 1 vLLM's engine core also sends batches of no tokens, where no peer
would wait). TP peers that looked for the file at one step, one before the test
made it and one after, fire in the same step: the writer's TP peers cannot
begin the next step before it has begun this one.

    sleep    block for `seconds` (default 3600), as a rank stuck inside a step
    raise    raise RuntimeError, which vLLM's worker loop catches and returns
    compile  torch.compile a function no cache has seen and run it (Inductor
             builds C++ in a subprocess under its cache lock), again with a new
             one until `seconds` (default 0: once) have passed, then go on
    assert   assert False: vLLM's worker loop catches the AssertionError too

vLLM loads general plugins in each worker before it builds the worker, and
hangscope wraps the worker's methods later, when the worker sets up its process
groups: so this wrapper runs inside hangscope's, after the phase was opened, as
a real fault inside the step would. Each fault says on stderr that it fired.
"""
from __future__ import annotations

import functools
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass

VAR = "HS_TEST_FAULT"
KINDS = ("sleep", "raise", "compile", "assert")
_calls = 0
_fired: set = set()


@dataclass(frozen=True)
class Fault:
    rank: int
    call: int
    kind: str
    seconds: float | None = None
    after: str | None = None
    dp: int = 0


def parse(text: str) -> list[Fault]:
    """The faults of HS_TEST_FAULT; ValueError names a malformed one."""
    faults = []
    for spec in filter(None, (part.strip() for part in text.split(";"))):
        fields = dict(item.split("=", 1) for item in spec.split(",") if "=" in item)
        if fields.get("kind") not in KINDS or not {"rank", "call"} <= fields.keys():
            raise ValueError(f"{VAR}: {spec!r} needs rank=R,call=N,kind={'|'.join(KINDS)}")
        faults.append(Fault(int(fields["rank"]), int(fields["call"]), fields["kind"],
                            float(fields["seconds"]) if "seconds" in fields else None,
                            fields.get("after"), int(fields.get("dp", 0))))
    return faults


def register() -> None:
    """vLLM's entry point: in a worker process, wrap Worker.execute_model."""
    text = os.environ.get(VAR)
    if not text or not multiprocessing.current_process().name.startswith("VllmWorker"):
        return
    faults = parse(text)
    from vllm.v1.worker import gpu_worker
    worker_cls = gpu_worker.Worker
    if getattr(worker_cls.execute_model, "hs_test_faults", False):
        return
    worker_cls.execute_model = _with_faults(worker_cls.execute_model, faults)


def _with_faults(original, faults: list[Fault]):
    @functools.wraps(original)
    def execute_model(self, *args, **kwargs):
        global _calls
        _calls += 1
        work = _has_work(args[0] if args else kwargs.get("scheduler_output"))
        for fault in faults:
            if fault.rank == self.rank and fault.dp == _dp_rank(self) and _due(fault, work):
                _fired.add(fault)
                _fire(fault)
        return original(self, *args, **kwargs)
    execute_model.hs_test_faults = True
    return execute_model


def _dp_rank(worker) -> int:
    """0.32 resets a dense model's data_parallel_rank to 0 and keeps it in
    data_parallel_index."""
    parallel = worker.parallel_config
    return max(getattr(parallel, "data_parallel_rank", 0),
               getattr(parallel, "data_parallel_index", 0))


def _has_work(scheduler_output) -> bool:
    return getattr(scheduler_output, "total_num_scheduled_tokens", 1) > 0


def _due(fault: Fault, work: bool) -> bool:
    if fault.after is None:
        return fault.call == _calls
    if not work or fault in _fired or _calls < fault.call:
        return False
    agreed = _agreed_call(fault.after)
    return agreed is not None and _calls >= agreed


def _agreed_call(path: str) -> int | None:
    """The call the faults of `path` fire from: written once, by the first worker
    that found `path` (a link, so no reader sees it half written)."""
    agreed = path + ".call"
    if not os.path.exists(agreed):
        if not os.path.exists(path):
            return None
        mine = f"{agreed}.{os.getpid()}"
        with open(mine, "w") as out:
            out.write(str(_calls + 1))
        try:
            os.link(mine, agreed)
        except FileExistsError:
            pass
        os.unlink(mine)
    with open(agreed) as written:
        return int(written.read())


def _fire(fault: Fault) -> None:
    print(f"hs_test_faults: rank {fault.rank} call {_calls}: {fault.kind}",
          file=sys.stderr, flush=True)
    if fault.kind == "sleep":
        time.sleep(3600.0 if fault.seconds is None else fault.seconds)
    elif fault.kind == "raise":
        raise RuntimeError(f"hs_test_faults: rank {fault.rank} raised at call {fault.call}")
    elif fault.kind == "assert":
        assert False, f"hs_test_faults: rank {fault.rank} asserted at call {fault.call}"
    else:
        end = time.monotonic() + (fault.seconds or 0.0)
        _compile_something_new()
        while time.monotonic() < end:
            _compile_something_new()
    print(f"hs_test_faults: rank {fault.rank} call {_calls}: {fault.kind} done",
          file=sys.stderr, flush=True)


def _compile_something_new() -> None:
    """A new function (its own code object, so Dynamo's recompile limit never
    turns it to eager) whose graph holds a constant no cache has seen, so
    Inductor builds it from scratch."""
    import torch
    salt = float(os.getpid() % 9973) + time.time() % 1.0
    source = (f"def new_function(x):\n"
              f"    return torch.nn.functional.gelu(x * {salt!r} + 1.0).sum(dim=-1)\n")
    namespace = {"torch": torch}
    exec(compile(source, f"<hs_test_faults {salt!r}>", "exec"), namespace)
    compiled = torch.compile(namespace["new_function"], backend="inductor", dynamic=False)
    compiled(torch.randn(8, 64))
