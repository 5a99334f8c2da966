"""Flight Recorder dumps of a hung TP x PP x DP serving job of any size, in
torch's own format (the one torchfrtrace reads), with one planted culprit.

Each step, every pipeline (a DP replica's TP x PP ranks) moves one batch through
its stages: a stage > 0 receives from the stage before, makes two all_reduces in
its TP group, and a stage < PP-1 sends to the stage after. In the last step the
culprit goes wrong, in one of three ways (FAULTS):

  missing       it never enters its first TP all_reduce; its TP peers wait in it
  mismatch      it enters its first TP all_reduce with another size; all wait in it
  stalled_send  it finishes its all_reduces but never sends; the next stage's
                peer waits in its recv, that stage's TP peers wait for it in their
                all_reduce, and every later stage waits in its recv

Only the culprit's pipeline stops; the other replicas are idle after the step.
A rank's dump lists the two groups it belongs to (its TP group and its pipeline),
as torch lists the groups a process is a member of. P2P ops name group-local
ranks (`nccl:send 2->3`), as NCCL's recorder does.
"""
from __future__ import annotations

import os
import pickle
import time
from dataclasses import dataclass

from diagnose.core.vocab import P2P_OPS, Op
from diagnose.offline.synth import OP_S, SHAPE, SynthError
from diagnose.offline.synth_fr import FR_STEP_S, TORCH_C10D

FAULTS = ("missing", "mismatch", "stalled_send")
HANG_S = 30.0


@dataclass(frozen=True)
class Layout:
    tp: int
    pp: int
    dp: int

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.dp

    def place(self, rank: int) -> tuple[int, int, int]:
        """(dp, pp, tp) of a global rank: rank = (dp * pp + stage) * tp + tp_rank."""
        return rank // (self.tp * self.pp), rank // self.tp % self.pp, rank % self.tp

    def tp_group(self, rank: int) -> list[int]:
        start = rank - rank % self.tp
        return list(range(start, start + self.tp))

    def pipeline(self, rank: int) -> list[int]:
        replica, _, tp_rank = self.place(rank)
        first = replica * self.tp * self.pp + tp_rank
        return [first + stage * self.tp for stage in range(self.pp)]


@dataclass(frozen=True)
class Call:
    step: int
    index: int                 # the call's place in its step
    group: tuple[str, str]     # (pg name, pg desc)
    op: str                    # all_reduce, send, recv
    peer: int | None           # send/recv: the other stage, group-local
    seq: int                   # collective_seq_id, or p2p_seq_id for send/recv
    shape: tuple[int, int]
    done: bool


def write_serving_fr_dumps(out_dir: str, layout: Layout, culprit: int, fault: str,
                           entries: int = 64, now: float | None = None,
                           steps: int | None = None) -> list[str]:
    """One dump per rank (`nccl_trace_rank_R`, at most `entries` entries, as a ring
    of that size holds them) after `steps` steps; by default enough steps that
    every ring wraps, as in a long run. Returns the paths."""
    _check(layout, culprit, fault, entries)
    os.makedirs(out_dir, exist_ok=True)
    now = time.time() if now is None else now
    steps = steps or entries // 3 + 2
    t0 = now - HANG_S - steps * FR_STEP_S
    paths = []
    for rank in range(layout.world):
        groups = _groups(layout, rank)
        calls = _calls(layout, rank, culprit, fault, steps, groups)
        dump = {"version": "2.10", "comm_lib_version": "2.21.5",
                "pg_config": {name: {"name": name, "desc": desc, "ranks": str(members)}
                              for (name, desc), members in groups.values()},
                "pg_status": {},
                "entries": [_entry(record_id, call, t0) for record_id, call in
                            enumerate(calls)][-entries:]}
        path = os.path.join(out_dir, f"nccl_trace_rank_{rank}")
        with open(path, "wb") as sink:
            pickle.dump(dump, sink, protocol=pickle.HIGHEST_PROTOCOL)
        paths.append(path)
    return paths


def _check(layout: Layout, culprit: int, fault: str, entries: int) -> None:
    if layout.tp < 2 or layout.pp < 2 or layout.dp < 1:
        raise SynthError(f"need tp >= 2, pp >= 2 and dp >= 1, not {layout}")
    if not 0 <= culprit < layout.world:
        raise SynthError(f"culprit {culprit} is not a rank of 0..{layout.world - 1}")
    if fault not in FAULTS:
        raise SynthError(f"unknown fault {fault!r}: one of {', '.join(FAULTS)}")
    if fault == "stalled_send" and layout.place(culprit)[1] == layout.pp - 1:
        raise SynthError(f"rank {culprit} is a last stage: it has no send to stall")
    if entries < 4:
        raise SynthError(f"entries must be at least 4, not {entries}")


def _groups(layout: Layout, rank: int) -> dict[str, tuple[tuple[str, str], list[int]]]:
    """The rank's TP group and pipeline, under torch-like names: pg ids in the order
    every rank would create them (all TP groups, then all pipelines)."""
    tp_index = rank // layout.tp
    pipe_index = layout.place(rank)[0] * layout.tp + layout.place(rank)[2]
    pipes_base = layout.world // layout.tp
    return {"tp": ((str(1 + tp_index), f"tp{tp_index}"), layout.tp_group(rank)),
            "pp": ((str(1 + pipes_base + pipe_index), f"pp{pipe_index}"), layout.pipeline(rank))}


def _calls(layout: Layout, rank: int, culprit: int, fault: str, steps: int,
           groups: dict) -> list[Call]:
    """Every call the rank made, the last step's as the fault leaves them."""
    stage = layout.place(rank)[1]
    tp_pg, pp_pg = groups["tp"][0], groups["pp"][0]
    stuck = _last_step(layout, rank, culprit, fault)
    calls: list[Call] = []
    seqs = {"all_reduce": 0, "p2p": 0}      # torch counts a group's sends and recvs together

    def add(step, op, group, peer=None, shape=tuple(SHAPE), done=True):
        counter = "all_reduce" if peer is None else "p2p"
        seqs[counter] += 1
        calls.append(Call(step, len(calls), group, op, peer, seqs[counter], shape, done))

    for step in range(steps):
        last = step == steps - 1
        if stage > 0:
            add(step, "recv", pp_pg, stage - 1, done=not (last and stuck == "recv"))
            if last and stuck == "recv":
                return calls
        if last and stuck == "skips_all_reduce":
            return calls
        shape = (SHAPE[0], SHAPE[1] * 2) if last and stuck == "odd_all_reduce" else tuple(SHAPE)
        waits = last and stuck in ("all_reduce", "odd_all_reduce")
        add(step, "all_reduce", tp_pg, shape=shape, done=not waits)
        if waits:
            return calls
        add(step, "all_reduce", tp_pg)
        if stage < layout.pp - 1:
            if last and stuck == "skips_send":
                return calls
            add(step, "send", pp_pg, stage + 1)
    return calls


def _last_step(layout: Layout, rank: int, culprit: int, fault: str) -> str | None:
    """How the rank's last step ends: None (whole), or where it stops."""
    if layout.place(rank)[0] != layout.place(culprit)[0]:
        return None                                  # another replica: unaffected
    if rank == culprit:
        return {"missing": "skips_all_reduce", "mismatch": "odd_all_reduce",
                "stalled_send": "skips_send"}[fault]
    stage, culprit_stage = layout.place(rank)[1], layout.place(culprit)[1]
    stopped = culprit_stage + 1 if fault == "stalled_send" else culprit_stage
    if stage > stopped or (fault == "stalled_send" and rank == culprit + layout.tp):
        return "recv"
    return "all_reduce" if stage == stopped else None


def _entry(record_id: int, call: Call, t0: float) -> dict:
    created = int((t0 + call.step * FR_STEP_S + call.index * OP_S) * 1e9)
    p2p = call.op in P2P_OPS
    me = call.peer - 1 if call.op == Op.SEND else call.peer + 1 if p2p else None
    name = (f"nccl:{call.op} {me}->{call.peer}" if call.op == Op.SEND else
            f"nccl:{call.op} {me}<-{call.peer}" if p2p else f"nccl:{call.op}")
    sizes = [list(call.shape)]
    return {
        "record_id": record_id, "pg_id": int(call.group[0]), "process_group": call.group,
        "collective_seq_id": 0 if p2p else call.seq, "p2p_seq_id": call.seq if p2p else 0,
        "op_id": record_id, "profiling_name": name, "time_created_ns": created,
        "input_sizes": sizes, "input_dtypes": ["BFloat16"], "output_sizes": [list(sizes[0])],
        "output_dtypes": ["BFloat16"], "state": "completed" if call.done else "started",
        "time_discovered_started_ns": created + 1000,
        "time_discovered_completed_ns": created + int(OP_S * 1e9) if call.done else None,
        "retired": call.done, "timeout_ms": 600000, "is_p2p": p2p,
        "thread_id": "140000000000000", "thread_name": "pt_main_thread",
        "frames": [{"name": call.op, "filename": TORCH_C10D, "line": 2806},
                   {"name": "forward", "filename": "/srv/engine/model.py", "line": 88},
                   {"name": "execute_model", "filename": "/srv/engine/worker.py", "line": 131}],
    }
