"""`diag synth --fr-dumps`: Flight Recorder dumps of a hung job of any size, as
NCCL's Flight Recorder writes them (one pickle per rank), with a planted culprit
that missed a TP all_reduce."""
from __future__ import annotations

import os
import pickle
import time

from diagnose.core.layout import tp_group_name
from diagnose.offline.synth import HANG_S, OP_S, SHAPE, SynthError, check_layout

FR_CALLS_PER_STEP = 3   # two all_reduces in the rank's TP group, one in the world group
FR_STEP_S = 0.05
TORCH_C10D = "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"


def write_fr_dumps(out_dir: str, ranks: int, tp: int, culprit: int, entries: int = 2000,
                   now: float | None = None, hang_s: float = HANG_S) -> list[str]:
    """One NCCL Flight Recorder dump per rank (`nccl_trace_rank_R`, `entries`
    entries each, as torch's ring of that size holds them). Each step a rank
    makes two all_reduces in its TP group and one in the world group; in the
    last step `culprit` makes none, its TP peers wait in their first, everyone
    else in the world all_reduce. Returns the paths."""
    check_layout(ranks, tp, culprit)
    if entries < 1:
        raise SynthError(f"--fr-entries must be at least 1, not {entries}")
    os.makedirs(out_dir, exist_ok=True)
    now = time.time() if now is None else now
    steps = -(-entries // FR_CALLS_PER_STEP)        # the culprit's ring is full too
    t0 = now - hang_s - steps * FR_STEP_S
    world = {"name": "0", "desc": "default_pg", "ranks": str(list(range(ranks)))}
    paths = []
    for rank in range(ranks):
        stage = rank // tp
        tp_group = {"name": str(stage + 1), "desc": tp_group_name(stage),
                    "ranks": str(list(range(stage * tp, stage * tp + tp)))}
        calls = _fr_calls(rank, tp, culprit, steps)
        dump = {"version": "2.10", "comm_lib_version": "2.21.5",
                "pg_config": {"0": world, tp_group["name"]: tp_group},
                "pg_status": {},
                "entries": [_fr_entry(record_id, call, t0)
                            for record_id, call in enumerate(calls)][-entries:]}
        path = os.path.join(out_dir, f"nccl_trace_rank_{rank}")
        with open(path, "wb") as sink:
            pickle.dump(dump, sink, protocol=pickle.HIGHEST_PROTOCOL)
        paths.append(path)
    return paths


def _fr_calls(rank: int, tp: int, culprit: int, steps: int) -> list[tuple]:
    """(step, call in step, (pg name, pg desc), seq, done) of every call the rank made."""
    stage = rank // tp
    tp_pg = (str(stage + 1), tp_group_name(stage))
    calls = []
    for step in range(steps + 1):
        last = step == steps
        for call in range(FR_CALLS_PER_STEP):
            if last and rank == culprit:
                return calls
            world = call == FR_CALLS_PER_STEP - 1
            pg = ("0", "default_pg") if world else tp_pg
            seq = step + 1 if world else 2 * step + call + 1
            waits = last and (world or rank // tp == culprit // tp)
            calls.append((step, call, pg, seq, not waits))
            if waits:
                return calls
    return calls


def _fr_entry(record_id: int, call: tuple, t0: float) -> dict:
    step, index, pg, seq, done = call
    created = int((t0 + step * FR_STEP_S + index * OP_S) * 1e9)
    sizes = [[SHAPE[0], SHAPE[1]]]
    return {
        "record_id": record_id, "pg_id": int(pg[0]), "process_group": pg,
        "collective_seq_id": seq, "p2p_seq_id": 0, "op_id": record_id,
        "profiling_name": "nccl:all_reduce", "time_created_ns": created,
        "input_sizes": sizes, "input_dtypes": ["BFloat16"], "output_sizes": [list(sizes[0])],
        "output_dtypes": ["BFloat16"], "state": "completed" if done else "started",
        "time_discovered_started_ns": created + 1000,
        "time_discovered_completed_ns": created + int(OP_S * 1e9) if done else None,
        "retired": done, "timeout_ms": 600000, "is_p2p": False,
        "thread_id": "140000000000000", "thread_name": "pt_main_thread",
        "frames": [{"name": "all_reduce", "filename": TORCH_C10D, "line": 2806},
                   {"name": "forward", "filename": "/srv/engine/layers.py", "line": 197},
                   {"name": "execute_model", "filename": "/srv/engine/worker.py", "line": 131}],
    }
