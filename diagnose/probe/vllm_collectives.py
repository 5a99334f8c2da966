"""vLLM's collectives as probe records: the methods of its GroupCoordinator,
the layer every TP all-reduce/all-gather and PP send/recv of a vLLM worker
goes through.

Group names follow the engine's: the TP group of PP stage p is "tp{p}"
("tp{p}.{c}" under PCP), the PP group "pp", others keep vLLM's name. What runs
in Python is traced: eager code (the logits all-gather, the PP tensor-dict
send/recv, --enforce-eager models) and, on GPU, the custom op that compiled
graphs call for an all-reduce. Inside a compiled model on CPU the all-reduce is C++ only, and a
CUDA graph replay runs no Python: those calls are not seen, which the
analysis allows for. Calls a traced call makes are its own.
"""
from __future__ import annotations

import functools
import sys
import threading

from diagnose import probe
from diagnose.core.layout import tp_group_name
from diagnose.core.vocab import Op, Role
from diagnose.probe.torch_dist import TracedWork
from diagnose.probe.vllm_hooks import Hook

PARALLEL_STATE = "vllm.distributed.parallel_state"

TRACED = {   # GroupCoordinator method -> the op recorded
    "all_reduce": Op.ALL_REDUCE,
    "_all_reduce_out_place": Op.ALL_REDUCE,
    "all_gather": Op.ALL_GATHER,
    "gather": Op.GATHER,
    "broadcast": Op.BROADCAST,
    "broadcast_object": Op.BROADCAST,
    "barrier": Op.BARRIER,
    "send_tensor_dict": Op.SEND,
    "isend_tensor_dict": Op.SEND,
    "recv_tensor_dict": Op.RECV,
    "irecv_tensor_dict": Op.RECV,
}
ASYNC_SEND = "isend_tensor_dict"    # its tensor handles are waited at the next step
SINCE = {"isend_tensor_dict": "0.17-0.32", "irecv_tensor_dict": "0.17-0.32"}
OPTIONAL = {"_all_reduce_out_place": "all_reduce is traced whichever way it goes",
            "isend_tensor_dict": "older releases send with send_tensor_dict, which is traced",
            "irecv_tensor_dict": "older releases receive with recv_tensor_dict, which is traced"}

_inside = threading.local()
_names: dict[int, str] = {}
layout = None        # the worker's Layout, set by the plugin as the probe starts


def _hooked(method: str, op: str):
    def wrap(original, coordinator):
        import torch
        parallel_state = sys.modules[coordinator.__module__]
        return _traced(original, method, op, parallel_state, torch.compiler.is_compiling)
    return wrap


HOOKS = [Hook(PARALLEL_STATE, f"GroupCoordinator.{method}", f"the {op} calls of vLLM's groups",
              SINCE.get(method, "0.10-0.32"), Role.WORKER, _hooked(method, op),
              optional=OPTIONAL.get(method, ""))
         for method, op in TRACED.items()]


def _traced(original, method: str, op: str, parallel_state, compiling):
    @functools.wraps(original)
    def traced(group, *args, **kwargs):
        if compiling() or getattr(_inside, "active", False) or group.world_size <= 1:
            return original(group, *args, **kwargs)
        record = probe.collective(_group_name(group, parallel_state), op, _tensors(args),
                                  peer=_peer(group, op, args, kwargs))
        record.__enter__()
        if record.skip:
            return _skipped(method)
        _inside.active = True
        try:
            result = original(group, *args, **kwargs)
        except BaseException:
            record.__exit__(None, None, None)
            raise
        finally:
            _inside.active = False
        if method == ASYNC_SEND and len(result) > 1:
            return result[:-1] + [TracedWork(result[-1], [record])]
        record.__exit__(None, None, None)
        return result
    return traced


def _group_name(group, parallel_state) -> str:
    name = _names.get(id(group))
    if name is None:
        kind = group.unique_name.split(":")[0]
        if kind == "tp" and layout is not None:
            name = layout.tp_group(group.ranks[group.rank_in_group])
        elif kind == "tp":
            name = tp_group_name(parallel_state.get_pp_group().rank_in_group)
        else:
            name = kind if kind in ("pp", "world") else group.unique_name
        _names[id(group)] = name
    return name


def _tensors(args: tuple) -> list:
    first = args[0] if args else None
    if isinstance(first, dict):
        return [value for value in first.values() if hasattr(value, "shape")]
    return [first] if hasattr(first, "shape") else []


def _peer(group, op: str, args: tuple, kwargs: dict) -> int | None:
    """The global rank at the other end of a send/recv (vLLM takes the peer's rank
    within the group, by default the next or the previous stage)."""
    if op == Op.SEND:
        local = kwargs.get("dst", args[1] if len(args) > 1 else None)
        default = group.rank_in_group + 1
    elif op == Op.RECV:
        local = kwargs.get("src", args[0] if args else None)
        default = group.rank_in_group - 1
    else:
        return None
    return group.ranks[(default if local is None else local) % group.world_size]


def _skipped(method: str):
    """What a call skipped by a skip_collective fault returns: nothing received."""
    return {"irecv_tensor_dict": (None, [], []), "isend_tensor_dict": []}.get(method)
