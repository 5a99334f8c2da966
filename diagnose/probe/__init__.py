"""The probe inside every rank: identity, phases, collectives and a heartbeat,
published to the rank's file in the run dir (docs/run-dir.md).

Off unless DIAG_RUN_DIR is set when `init` runs; then every call below costs one
global check. When on, the process that calls `init` writes `rank-{R}.probe`
(the driver: `driver.probe`). Phases and collectives are meant to be entered by
one thread (the engine loop); the heartbeat thread reports that thread's frame
and writes `stacks-{R}.json` when the collector asks for a dump.

The modules: calls.py (what `phase`, `collective` and the graph calls return),
recorder.py (the probe that is on, and its heartbeat thread), faults.py,
torch_dist.py and marks.py (tracing programs we did not write), stacks.py,
rank_env.py, bootstrap/ (the sitecustomize `diag launch` puts first on
PYTHONPATH). Code here runs inside someone else's process: it must be cheap,
must never raise into the host program (except on misuse of the API), and
imports only the standard library, psutil, diagnose.core and, where a rank
traces a GPU, torch.

Two more files say how a rank ended, when it ended badly: `error-{R}.json`, the
exception that last left a phase (with its traceback, written before any
clean-up runs), and `fatal-{R}.txt`, every thread's Python stack on a fatal
signal such as the SIGABRT of NCCL's watchdog (faulthandler).
"""
from __future__ import annotations

import atexit
import faulthandler
import os
import socket
import sys
import time

from diagnose.core.groups import encode as encode_groups
from diagnose.core.vocab import Phase, Role
from diagnose.probe import rank_env
from diagnose.probe.calls import OFF, Capture, PhaseCall, Replay
from diagnose.probe.recorder import Recorder

RUN_DIR_VAR = "DIAG_RUN_DIR"
TRACED_ENV = ("CUDA_LAUNCH_BLOCKING",)

_probe: Recorder | None = None


def init(role, rank=None, world_size=None, tp_rank=None, tp_size=None,
         pp_rank=None, pp_size=None, device="cpu", groups=None, label=None):
    """role "worker" or "process" needs a rank (for "process", RANK from the
    environment will do); "driver" has none; label is the rank's name in its own
    program (vLLM's "Worker_PP1_TP0"). A second call is ignored."""
    global _probe
    run_dir = os.environ.get(RUN_DIR_VAR)
    if not run_dir or _probe is not None:
        return
    if role != Role.DRIVER and rank is None:
        if "RANK" not in os.environ:
            raise ValueError(f"probe.init(role={role!r}) needs a rank (or RANK in the environment)")
        rank = int(os.environ["RANK"])
    rank_env.apply(run_dir, None if role == Role.DRIVER else rank)
    identity = {
        "role": str(role), "rank": None if role == Role.DRIVER else rank, "world_size": world_size,
        "tp_rank": tp_rank, "tp_size": tp_size, "pp_rank": pp_rank, "pp_size": pp_size,
        "host": socket.gethostname(), "pid": os.getpid(), "device": str(device),
        "env": {key: value for key, value in os.environ.items()
                if key in TRACED_ENV or key.startswith("NCCL_")},
        "groups": encode_groups(groups or {}),
        "label": label,
    }
    _probe = Recorder(run_dir, identity)
    os.register_at_fork(after_in_child=_forget)
    _mark_normal_exit()


def _mark_normal_exit() -> None:
    """A normal end enters Phase.EXIT last, so that the analysis takes the process
    for finished, not dead, even before the command's exit code is known (a
    driver's interpreter ends before a shell around it, or before the kernel has
    torn its CUDA context down). Normal: returning from main or sys.exit, with
    any status (the status is not known here: `sys.exit(main())` looks sys.exit
    up before main starts the probe). Not normal: an uncaught exception, a
    signal, os._exit (the last two run no atexit)."""
    failed = []
    excepthook = sys.excepthook

    def note_exception(*exc_info):
        failed.append(True)
        excepthook(*exc_info)

    def at_exit():
        if not failed:
            with phase(Phase.EXIT):
                pass

    sys.excepthook = note_exception
    atexit.register(at_exit)


def _forget():
    """A forked child must not write into its parent's files; it may init its own."""
    global _probe
    if _probe is not None:
        faulthandler.disable()
    _probe = None


def is_on() -> bool:
    """Whether this process's probe was started (init ran with DIAG_RUN_DIR set)."""
    return _probe is not None


def phase(name, step=None):
    probe = _probe
    if probe is None:
        return OFF
    return PhaseCall(probe, name, step)


def collective(group, op, tensors, peer=None):
    """Use only as `with probe.collective(...) as record`: the record is made here."""
    probe = _probe
    if probe is None:
        return OFF
    return probe.begin_collective(group, op, tensors, peer, sys._getframe(1))


def graph_capture():
    """Use as `with probe.graph_capture() as graph:` around a CUDA graph's capture.
    The collectives called inside are not recorded then (the capture runs none);
    `with probe.graph_replay(graph):` around each replay records them all again."""
    probe = _probe
    if probe is None:
        return OFF
    return Capture(probe)


def graph_replay(graph):
    probe = _probe
    if probe is None or not graph.calls:
        return OFF
    return Replay(probe, graph.calls)


def kv_stats(step, used, free, allocated, freed, preempted):
    if _probe is not None:
        _probe.file.kv_stats(step, used, free, allocated, freed, preempted)


def ring_state(written):
    if _probe is not None:
        _probe.file.ring_written(written)


def ring_read(count):
    if _probe is not None:
        _probe.file.ring_read(count)


def worker_exit(rank, exitcode):
    if _probe is not None:
        _probe.file.worker_exit(rank, exitcode, time.time())
