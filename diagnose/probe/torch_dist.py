"""The probe in programs we did not write: torchrun jobs and other engines.

`install()` runs at start-up in every Python process of a `diag launch` run
(diagnose/probe/bootstrap/sitecustomize.py calls it). It costs nothing until
torch.distributed is imported; then it wraps init_process_group, so that the
process that joins a process group calls `probe.init(role="process")`, and
every collective and point-to-point call, so that each becomes a probe record.
A process that never joins a group (torchrun's agent) writes no file.

Group names are the same on every rank: "world" for the default group, else
"g" and the member ranks. An async call (isend, irecv, async_op=True,
batch_isend_irecv) completes when wait() on its Work returns.
"""
from __future__ import annotations

import functools
import importlib.abc
import inspect
import sys
import threading
import zlib

from diagnose import probe
from diagnose.core.vocab import P2P_OPS, Op, Role
from diagnose.probe import fr_dump, notes

GROUP_NAME_BYTES = 16   # the probe file's group field

# torch.distributed function -> (op recorded, the argument holding its tensor)
TRACED = {
    "all_reduce": (Op.ALL_REDUCE, "tensor"),
    "all_gather": (Op.ALL_GATHER, "tensor"),
    "all_gather_into_tensor": (Op.ALL_GATHER, "input_tensor"),
    "reduce_scatter": (Op.REDUCE_SCATTER, "output"),
    "reduce_scatter_tensor": (Op.REDUCE_SCATTER, "input"),
    "broadcast": (Op.BROADCAST, "tensor"),
    "barrier": (Op.BARRIER, None),
    "send": (Op.SEND, "tensor"),
    "recv": (Op.RECV, "tensor"),
    "isend": (Op.SEND, "tensor"),
    "irecv": (Op.RECV, "tensor"),
}
ALWAYS_ASYNC = ("isend", "irecv")


# Running code when a module is imported.

class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls the callbacks registered for a module once it has been executed."""

    def __init__(self):
        self.callbacks: dict[str, list] = {}

    def find_spec(self, name, path, target=None):
        if name not in self.callbacks:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _CallbackLoader(spec.loader, self.callbacks.pop(name))
                return spec
        return None


class _CallbackLoader(importlib.abc.Loader):
    def __init__(self, loader, callbacks):
        self.loader = loader
        self.callbacks = callbacks

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        for callback in self.callbacks:
            _call(callback, module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


_hook = _AfterImport()


def on_import(module_name: str, callback) -> None:
    """callback(module) once `module_name` is imported (now, if it already is).
    An error of the callback is a note in the run's report: the import goes on."""
    if module_name in sys.modules:
        _call(callback, sys.modules[module_name])
        return
    if _hook not in sys.meta_path:
        sys.meta_path.insert(0, _hook)
    _hook.callbacks.setdefault(module_name, []).append(callback)


def _call(callback, module) -> None:
    try:
        callback(module)
    except Exception as error:
        notes.note(f"hangscope: its hook on {module.__name__} failed and was left out "
                   f"({type(error).__name__}: {error}); the program went on without it")


def install() -> None:
    on_import("torch.distributed", patch_torch_distributed)
    on_import("torch.distributed", fr_dump.drop_deprecated_alias)


# Patching torch.distributed.

_inside = threading.local()   # set while a traced call runs: the calls it makes are its own
_tracing = False              # this module started the probe: programs that start it
                              # themselves (the engine) trace their own calls


def patch_torch_distributed(dist) -> None:
    from torch.distributed import distributed_c10d as c10d
    if not dist.is_available():
        return
    patched = {"init_process_group": _traced_init(dist, c10d.init_process_group),
               "batch_isend_irecv": _traced_batch(dist, c10d.batch_isend_irecv)}
    for name, (op, tensor_arg) in TRACED.items():
        patched[name] = _traced_call(dist, getattr(c10d, name), op, tensor_arg,
                                     name in ALWAYS_ASYNC)
    for name, function in patched.items():
        setattr(c10d, name, function)   # P2POp checks its op against c10d's isend/irecv
        setattr(dist, name, function)


def _traced_init(dist, init_process_group):
    @functools.wraps(init_process_group)
    def init(*args, **kwargs):
        global _tracing
        result = init_process_group(*args, **kwargs)
        if probe.is_on():
            return result
        _tracing = True
        world_size = dist.get_world_size()
        device = "cuda" if dist.get_backend() == "nccl" else "cpu"
        probe.init(role=Role.PROCESS, rank=dist.get_rank(), world_size=world_size,
                   device=device, groups={"world": list(range(world_size))})
        return result
    return init


def _traced_call(dist, function, op, tensor_arg, always_async):
    signature = inspect.signature(function)
    is_p2p = op in P2P_OPS

    @functools.wraps(function)
    def traced(*args, **kwargs):
        if not _tracing or getattr(_inside, "active", False):
            return function(*args, **kwargs)
        bound = signature.bind(*args, **kwargs)
        given = bound.arguments
        group = given.get("group")
        tensors = [given[tensor_arg]] if tensor_arg else []
        peer = _peer(dist, given, op, group) if is_p2p else None
        record = probe.collective(group_name(dist, group), op, tensors, peer=peer)
        record.__enter__()
        if record.skip:
            return None
        _inside.active = True
        try:
            result = function(*args, **kwargs)
        except BaseException:
            record.__exit__(None, None, None)
            raise
        finally:
            _inside.active = False
        if result is not None and (always_async or given.get("async_op")):
            return TracedWork(result, [record])
        record.__exit__(None, None, None)
        return result
    return traced


def _traced_batch(dist, batch_isend_irecv):
    @functools.wraps(batch_isend_irecv)
    def traced(p2p_op_list):
        if not _tracing or getattr(_inside, "active", False):
            return batch_isend_irecv(p2p_op_list)
        records = []
        for p2p in p2p_op_list:
            op = Op.SEND if p2p.op is dist.isend else Op.RECV
            record = probe.collective(group_name(dist, p2p.group), op, [p2p.tensor], peer=p2p.peer)
            records.append(record.__enter__())
        _inside.active = True
        try:
            works = batch_isend_irecv(p2p_op_list)
        finally:
            _inside.active = False
        if len(works) == len(records):     # one Work per op (gloo)
            return [TracedWork(work, [record]) for work, record in zip(works, records)]
        return [TracedWork(work, records) for work in works]   # one coalesced Work (NCCL)
    return traced


def _peer(dist, given, op, group) -> int | None:
    name = "dst" if op == Op.SEND else "src"
    if given.get(name) is not None:
        return given[name]
    local = given.get(f"group_{name}")
    if local is None:
        return None
    return dist.get_global_rank(group, local) if group is not None else local


_group_names: dict[int, str] = {}


def group_name(dist, group) -> str:
    """'world', or 'g' and the member ranks ('g0,2'); a crc of them when too long."""
    if group is None or group is dist.GroupMember.WORLD:
        return "world"
    name = _group_names.get(id(group))
    if name is None:
        ranks = ",".join(map(str, dist.get_process_group_ranks(group)))
        name = f"g{ranks}"
        if len(name) > GROUP_NAME_BYTES:
            name = f"g#{zlib.crc32(ranks.encode()):08x}"
        _group_names[id(group)] = name
    return name


class TracedWork:
    """A torch Work whose wait() completes the probe records of its call."""

    def __init__(self, work, records):
        self._work = work
        self._records = records

    def wait(self, *args, **kwargs):
        result = self._work.wait(*args, **kwargs)
        for record in self._records:
            record.__exit__(None, None, None)
        self._records = []
        return result

    def __getattr__(self, name):
        return getattr(self._work, name)
