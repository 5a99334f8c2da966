"""The tests' own fault for diag attach on our engine, started without diag.

With ATTACH_BLOCK_RANK=R in the environment, the worker of global rank R blocks
before its first Worker.execute_model, as a deadlock would: it takes a lock it
already holds. Its peers go on into the step and wait for it in the TP
all-reduce and the PP recv. `--fault` cannot do this here: it needs diag's probe,
which a job started without diag does not run. On PYTHONPATH, Python imports
this module at start in every process of the job; it patches engine.worker.worker when
that module is first imported, and does nothing in a process without the
variable.
"""
import importlib.abc
import importlib.util
import os
import sys
import threading

BLOCK_RANK = os.environ.get("ATTACH_BLOCK_RANK")


def _deadlock() -> None:
    lock = threading.Lock()
    lock.acquire()
    print(f"attach fault: rank {BLOCK_RANK} blocks before execute_model", file=sys.stderr,
          flush=True)
    lock.acquire()


def _patch(module) -> None:
    original = module.Worker.execute_model

    def execute_model(self, scheduler_output):
        import torch.distributed as dist
        if dist.get_rank() == int(BLOCK_RANK):
            _deadlock()
        return original(self, scheduler_output)

    module.Worker.execute_model = execute_model


class _PatchEngineWorker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "engine.worker.worker":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        spec.loader.exec_module = exec_module
        return spec


if BLOCK_RANK is not None:
    sys.meta_path.insert(0, _PatchEngineWorker())
