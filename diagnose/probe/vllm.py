"""vLLM's processes as the probe sees them: a vLLM general plugin (the
`vllm.general_plugins` entry point `hangscope`), inert unless DIAG_RUN_DIR is
set. `diag launch` also calls `register` when vLLM's plugin module is
imported, so a vLLM environment without hangscope installed is traced too.

In the EngineCore (the driver): every collective_rpc is one message of the
executor's shared-memory broadcast queue (`probe.ring_state`), and the wait
for the reply of an execute_model or sample_tokens call is the driver's phase
of that name. In each worker (`VllmWorker-<rank>`): the probe starts when
vLLM sets up the worker's distributed environment, with the rank layout of
vLLM's parallel config (core/layout.py) and the name vLLM gives the worker
(`Worker_PP1_TP0`, the identity's label); the worker's start-up calls and each
execute_model (its step: the count of execute_model calls, the same on every
rank) and sample_tokens are phases; its wait on the broadcast queue is the
dequeue phase, and each message it takes is counted (`probe.ring_read`); the
group coordinator's collectives are records (vllm_collectives.py). Faults
(`--fault`) fire at these phases as in the engine.

Every hook is a row of HOOKS (the end of this file), applied by name with a
check (vllm_hooks.py): a name the running release lacks is a note in the
run's report, and the rest still work.

vLLM's data parallelism is not traced: each DP engine core numbers
its workers from 0, so their probe files would share names. An engine core of
a DP job (named `EngineCore_DP<k>` for k >= 1) and its workers run without
the probe: it says so in a note and drops DIAG_RUN_DIR, so the workers it
starts stay inert. A worker whose parallel config is a DP rank's does the
same, and so does DP rank 0's engine core where its executor's config is DP's
(the release or the model keeps the DP size): it stays idle. 0.32 runs a
dense model's DP ranks as independent engine cores, each config reset to DP
size 1: DP rank 0 is then traced as the whole job it is.

Nothing here changes what torch.compile traces: every wrapper that a compiled
region may reach returns the original call at once while Dynamo traces.
"""
from __future__ import annotations

import functools
import inspect
import multiprocessing
import multiprocessing.connection
import os
import re
import sys
import threading
import weakref
from dataclasses import dataclass

from diagnose import probe
from diagnose.core.layout import Layout
from diagnose.core.vocab import Phase, Role
from diagnose.probe import notes, stopping, torch_dist, vllm_collectives, vllm_hooks
from diagnose.probe.vllm_hooks import WORKER_CLASS, Hook, apply

DRIVER_PHASES = {"execute_model": Phase.EXECUTE_MODEL, "sample_tokens": Phase.SAMPLE}
EXECUTOR = "vllm.v1.executor.multiproc_executor"
GPU_WORKER = "vllm.v1.worker.gpu_worker"
ENGINE_CORE = "vllm.v1.engine.core"
CORE_CLIENT = "vllm.v1.engine.core_client"

EXIT_CODE_WAIT_S = 1.0   # a dying process's sentinel fires a moment before its exit code is readable
DP_ENGINE_CORE = re.compile(r"EngineCore_DP(\d+)")   # vLLM's name for an engine core under DP

_registered = False


def register() -> None:
    """The plugin's entry point; vLLM calls it once in each of its processes."""
    global _registered
    if _registered or not os.environ.get(probe.RUN_DIR_VAR):
        return
    _registered = True
    name = multiprocessing.current_process().name
    if name.startswith("VllmWorker"):
        vllm_hooks.install(HOOKS, Role.WORKER)
    elif name.startswith("EngineCore"):
        found = DP_ENGINE_CORE.fullmatch(name)
        if found is not None and int(found[1]) > 0:
            untraced(f"{name} and its workers")
            return
        probe.init(Role.DRIVER)
        vllm_hooks.install(HOOKS, Role.DRIVER)
    else:
        vllm_hooks.install(HOOKS, Role.FRONTEND)


def install() -> None:
    """`diag launch`'s way in: register once vLLM's plugins module is imported."""
    torch_dist.on_import("vllm.plugins", lambda module: register())


def untraced(what: str) -> None:
    """A process of a DP job: the run's report says what is not traced, and the
    processes it starts inherit no run dir."""
    notes.note(f"vLLM data parallelism is not traced: {what} ran without the probe")
    os.environ.pop(probe.RUN_DIR_VAR, None)


def dp_rank(parallel) -> int:
    """The DP rank of vLLM's parallel config: 0.32 resets a dense model's
    data_parallel_rank to 0 and keeps it in data_parallel_index."""
    return max(getattr(parallel, "data_parallel_rank", 0),
               getattr(parallel, "data_parallel_index", 0))


def data_parallel(parallel) -> bool:
    """Whether vLLM's parallel config is one rank's of a DP job."""
    return getattr(parallel, "data_parallel_size", 1) > 1 or dp_rank(parallel) > 0


# -- a worker ----------------------------------------------------------------

@dataclass
class _Counts:
    executed: int = 0   # execute_model calls begun (worker) or sent (driver): the step
    messages: int = 0   # broadcast messages taken (worker) or written (driver)


_counts = _Counts()


def _starting_probe(original, owner):
    """Start the probe as vLLM sets up the worker's process groups (the CPU and
    XPU workers import this function from the GPU worker's module)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init_worker_distributed_environment(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        parallel = given["vllm_config"].parallel_config
        if data_parallel(parallel):
            untraced(f"the workers of DP rank {dp_rank(parallel)}")
        else:
            _start_probe(given["vllm_config"], given["rank"], given.get("local_rank"))
        with probe.phase(Phase.INIT_DISTRIBUTED):
            return original(*args, **kwargs)

    return init_worker_distributed_environment


def _start_probe(vllm_config, rank: int, local_rank: int | None) -> None:
    """The worker's place from vLLM's own parallel config: TP, PCP and PP sizes
    (PCP where the release has it), in vLLM's order, and the name vLLM gives it."""
    parallel = vllm_config.parallel_config
    layout = Layout(parallel.tensor_parallel_size, parallel.pipeline_parallel_size,
                    getattr(parallel, "prefill_context_parallel_size", 1))
    pp_rank, tp_rank = layout.place(rank)
    device = str(vllm_config.device_config.device)
    if device.startswith("cuda") and local_rank is not None and local_rank >= 0:
        device = f"cuda:{local_rank}"
    vllm_collectives.layout = layout
    probe.init(Role.WORKER, rank=rank, world_size=layout.world_size, tp_rank=tp_rank,
               tp_size=layout.tp_size, pp_rank=pp_rank, pp_size=layout.pp_size,
               device=device, groups=layout.groups_of(rank), label=layout.vllm_name(rank))
    apply(_worker_class(parallel.worker_cls),
          [hook for hook in HOOKS if hook.module == WORKER_CLASS])


def _worker_class(qualified_name: str):
    module_name, _, class_name = qualified_name.rpartition(".")
    __import__(module_name)
    return getattr(sys.modules[module_name], class_name)


def _worker_phase(phase: Phase):
    return lambda original, owner: _as_worker_phase(original, phase)


def _as_worker_phase(original, phase: Phase):
    @functools.wraps(original)
    def method(*args, **kwargs):
        if phase == Phase.EXECUTE_MODEL:
            step, _counts.executed = _counts.executed, _counts.executed + 1
        else:
            step = _counts.executed - 1 if phase == Phase.SAMPLE else None
        with probe.phase(phase, step=step):
            return original(*args, **kwargs)
    return method


def _with_dequeue_phase(original, owner):
    """The busy loop waits on the broadcast queue: that wait is the dequeue phase."""
    @functools.wraps(original)
    def worker_busy_loop(self, *args, **kwargs):
        queue = self.rpc_broadcast_mq
        if queue is not None:
            queue.dequeue = _dequeue_phase(queue.dequeue)
        return original(self, *args, **kwargs)
    return worker_busy_loop


def _dequeue_phase(dequeue):
    @functools.wraps(dequeue)
    def phased(*args, **kwargs):
        with probe.phase(Phase.DEQUEUE, step=_counts.executed):
            message = dequeue(*args, **kwargs)
        _counts.messages += 1
        probe.ring_read(_counts.messages)
        return message
    return phased


# -- the EngineCore -------------------------------------------------------------

_pending = threading.local()   # .phase: (phase, step) of the call being made, for its future


def _counted_rpc(collective_rpc, owner):
    """Each collective_rpc broadcasts one message; the phase of a call whose reply
    the driver waits for is pending while it runs, for the wait's hook."""
    @functools.wraps(collective_rpc)
    def counted_rpc(self, method, *args, **kwargs):
        if data_parallel(getattr(self, "parallel_config", None)):
            _untraced_engine_core()
            return collective_rpc(self, method, *args, **kwargs)
        _counts.messages += 1
        probe.ring_state(_counts.messages)
        _pending.phase = _driver_phase(method)
        try:
            return collective_rpc(self, method, *args, **kwargs)
        finally:
            _pending.phase = None
    return counted_rpc


_said_untraced = False


def _untraced_engine_core() -> None:
    """An engine core whose executor's config is a DP rank's (0.11 keeps the DP
    size; 0.32 does for a MoE model): its probe began before the config was
    known, and it stays, idle, with no phase and no message counted, so that
    nothing waits on workers no probe sees (theirs is the same config: they
    are not traced). Said once."""
    global _said_untraced
    if not _said_untraced:
        _said_untraced = True
        untraced(f"{multiprocessing.current_process().name} and its workers")


def _future_wait(wait, future_cls):
    """A reply comes back through a FutureWrapper made by the call; its wait is
    the driver's phase of that call, whenever it is waited."""
    init = future_cls.__init__

    @functools.wraps(init)
    def tagged_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.diag_phase = getattr(_pending, "phase", None)

    @functools.wraps(wait)
    def phased_wait(self, *args, **kwargs):
        phase = getattr(self, "diag_phase", None)
        if phase is None:
            return wait(self, *args, **kwargs)
        with probe.phase(*phase):
            return wait(self, *args, **kwargs)

    future_cls.__init__ = tagged_init
    return phased_wait


def _blocking_wait(collective_rpc, owner):
    """Where no FutureWrapper carries the reply, a blocking call waits for it
    inside collective_rpc: the call is the driver's phase."""
    @functools.wraps(collective_rpc)
    def phased_rpc(self, *args, **kwargs):
        phase = getattr(_pending, "phase", None)
        if phase is None or kwargs.get("non_block"):
            return collective_rpc(self, *args, **kwargs)
        with probe.phase(*phase):
            return collective_rpc(self, *args, **kwargs)
    return phased_rpc


def _shutdown_requested(handle_shutdown, owner):
    """The engine core's loop handles a shutdown request (a signal from the API
    server) before it stops the executor, and the API server may kill it right
    after (0.26, timeout 0): the request is where the driver's shutdown begins."""
    @functools.wraps(handle_shutdown)
    def phased(engine_core, *args, **kwargs):
        state = getattr(engine_core, "shutdown_state", None)
        if getattr(state, "name", "RUNNING") == "RUNNING":
            return handle_shutdown(engine_core, *args, **kwargs)
        with probe.phase(Phase.SHUTDOWN):
            return handle_shutdown(engine_core, *args, **kwargs)
    return phased


def _as_shutdown(shutdown, owner):
    """vLLM's own shutdown is the driver's shutdown phase: the workers (and the
    engine core itself, killed by the API server) that end after it began
    ended on purpose. A worker already gone when it begins is why it began."""
    @functools.wraps(shutdown)
    def phased(executor, *args, **kwargs):
        if not getattr(executor, "shutting_down", False):
            try:
                note_gone_workers(getattr(executor, "workers", None) or [])
            except Exception as error:   # vLLM's handles are not what this release's were
                notes.note(f"vLLM {vllm_hooks.release()}: the workers gone at shutdown "
                           f"could not be read ({type(error).__name__}: {error})")
        with probe.phase(Phase.SHUTDOWN):
            return shutdown(executor, *args, **kwargs)
    return phased


def note_gone_workers(handles: list) -> None:
    """Note the exit of each worker whose process has ended or is ending. The
    kernel closes a dying process's files (its sentinel fires, and vLLM's monitor
    starts the shutdown) before its exit code can be read: wait for the code."""
    gone = set(multiprocessing.connection.wait([handle.proc.sentinel for handle in handles], 0))
    for handle in handles:
        if handle.proc.sentinel in gone:
            handle.proc.join(timeout=EXIT_CODE_WAIT_S)
            _note_exit(handle)


def _watching_workers(start_worker_monitor, owner):
    """The exit code of a worker that ends while the executor is not shutting
    down, as the engine's driver records it: the analysis can then say how the
    worker died."""
    @functools.wraps(start_worker_monitor)
    def watching(self, *args, **kwargs):
        threading.Thread(target=_watch_workers, args=(weakref.ref(self), list(self.workers)),
                         daemon=True, name="diag-vllm-workers").start()
        return start_worker_monitor(self, *args, **kwargs)
    return watching


def _watch_workers(executor, handles: list) -> None:
    left = {handle.proc.sentinel: handle for handle in handles}
    while left:
        for sentinel in multiprocessing.connection.wait(list(left)):
            handle = left.pop(sentinel)
            if executor() is None or getattr(executor(), "shutting_down", False):
                return
            handle.proc.join(timeout=EXIT_CODE_WAIT_S)
            _note_exit(handle)


_noted_exits: set[int] = set()
_noted_lock = threading.Lock()


def _note_exit(handle) -> None:
    """Once per worker: vLLM's monitor may start the shutdown before ours wakes."""
    with _noted_lock:
        if handle.rank in _noted_exits:
            return
        _noted_exits.add(handle.rank)
    probe.worker_exit(handle.rank, handle.proc.exitcode)


def _driver_phase(method) -> tuple[Phase, int] | None:
    phase = DRIVER_PHASES.get(method) if isinstance(method, str) else None
    if phase == Phase.EXECUTE_MODEL:
        _counts.executed += 1
    return None if phase is None else (phase, _counts.executed - 1)


# -- the API server ------------------------------------------------------------

def _announced_stop(shutdown, owner):
    """The API server's client of the engine core stops it (SIGINT to vLLM, or
    its end): said before it kills anything, since with its default timeout of
    0 it kills the engine core and the workers at once, before either can enter
    a shutdown phase."""
    @functools.wraps(shutdown)
    def announced(client, *args, **kwargs):
        stopping.began()
        return shutdown(client, *args, **kwargs)
    return announced


# -- the table -------------------------------------------------------------------
# Rows of one module are applied in this order: a later wrapper of the same
# function is the outer one (counting a collective_rpc comes before its wait).
WAIT = "the engine core's wait for replies"
HOOKS: list[Hook] = [
    Hook(GPU_WORKER, "init_worker_distributed_environment",
         "any worker (the probe starts here, with its rank and layout)", "0.10-0.32",
         Role.WORKER, _starting_probe),
    Hook(WORKER_CLASS, "load_model", "the load_weights phase", "0.10-0.32",
         Role.WORKER, _worker_phase(Phase.LOAD_WEIGHTS)),
    Hook(WORKER_CLASS, "determine_available_memory", "the memory profile (init_kv_cache phase)",
         "0.10-0.32", Role.WORKER, _worker_phase(Phase.INIT_KV_CACHE)),
    Hook(WORKER_CLASS, "initialize_from_config", "the KV cache set-up (init_kv_cache phase)",
         "0.10-0.32", Role.WORKER, _worker_phase(Phase.INIT_KV_CACHE)),
    Hook(WORKER_CLASS, "compile_or_warm_up_model", "the warmup phase", "0.10-0.32",
         Role.WORKER, _worker_phase(Phase.WARMUP)),
    Hook(WORKER_CLASS, "execute_model", "a worker's step (execute_model phase)", "0.10-0.32",
         Role.WORKER, _worker_phase(Phase.EXECUTE_MODEL)),
    Hook(WORKER_CLASS, "sample_tokens", "the sample phase", "0.12-0.32",
         Role.WORKER, _worker_phase(Phase.SAMPLE),
         optional="before 0.12 execute_model samples: its phase holds it"),
    Hook(EXECUTOR, "WorkerProc.worker_busy_loop",
         "a worker's wait on the broadcast queue (dequeue phase)", "0.10-0.32",
         Role.WORKER, _with_dequeue_phase),
    *vllm_collectives.HOOKS,
    Hook(EXECUTOR, "FutureWrapper.wait_for_response", WAIT + " (non-blocking calls)",
         "0.12-0.19", Role.DRIVER, _future_wait,
         optional="a release without it either blocks in every call or has the next row"),
    Hook(EXECUTOR, "FutureWrapper._wait_for_response", WAIT, "0.20-0.32",
         Role.DRIVER, _future_wait, group="reply"),
    Hook(EXECUTOR, "MultiprocExecutor.collective_rpc", WAIT + " (blocking calls)", "0.10-0.19",
         Role.DRIVER, _blocking_wait, group="reply"),
    Hook(EXECUTOR, "MultiprocExecutor.collective_rpc",
         "the broadcast messages the engine core writes", "0.10-0.32",
         Role.DRIVER, _counted_rpc),
    Hook(EXECUTOR, "MultiprocExecutor.shutdown", "the engine core's shutdown phase", "0.10-0.32",
         Role.DRIVER, _as_shutdown),
    Hook(ENGINE_CORE, "EngineCoreProc._handle_shutdown",
         "the engine core's shutdown phase, from the request", "0.18-0.32", Role.DRIVER,
         _shutdown_requested, optional="before it the shutdown begins in the executor's"),
    Hook(EXECUTOR, "MultiprocExecutor.start_worker_monitor", "the exit codes of dead workers",
         "0.10-0.32", Role.DRIVER, _watching_workers),
    Hook(CORE_CLIENT, "MPClient.shutdown",
         "when the API server begins to stop the engine (the deaths it causes may read as "
         "failures)", "0.11-0.32", Role.FRONTEND, _announced_stop),
]
