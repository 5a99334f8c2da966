"""A worker process: start-up phases, then the busy loop dequeue -> method -> reply.

On a GPU a step's reply waits until the next batch has been launched (Replies): the
next batch gathers the tokens it needs on the device, so the GPU runs it while the
host copies the tokens, replies and prepares the one after. Replies leave in the
order the RPCs came. ENGINE_WORKER_OVERLAP=0 replies at once, to compare the two.
"""
from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass

import torch

from diagnose import probe
from diagnose.core.layout import Layout
from diagnose.core.proc_names import engine_rank_name, name_this_process
from diagnose.core.vocab import Phase, Role
from engine.communicator import Communicator
from engine.config import EngineConfig
from engine.model.loader import resolve_model
from engine.worker.model_runner import ModelRunner, SampledStep
from engine.worker.shm_ring import RingClosed, ShmRing

WORKER_OVERLAP = os.environ.get("ENGINE_WORKER_OVERLAP", "1") != "0"


@dataclass
class WorkerArgs:
    config: EngineConfig
    rank: int            # global: the torch.distributed rank
    local_rank: int      # on this node: the ring reader index and the CUDA device
    init_method: str
    ring_handle: tuple
    device: str          # "cpu" or "cuda"
    dtype: torch.dtype
    parent_pid: int


class Worker:
    """The methods collective_rpc can call."""

    def __init__(self, args: WorkerArgs):
        config = args.config
        layout = Layout(config.tensor_parallel_size, config.pipeline_parallel_size)
        self.device = _pick_device(args)
        # The probe comes first: it applies per-rank settings such as
        # CUDA_LAUNCH_BLOCKING, which must be in place before CUDA starts.
        pp_rank, tp_rank = layout.place(args.rank)
        probe.init(Role.WORKER, rank=args.rank, world_size=layout.world_size,
                   tp_rank=tp_rank, tp_size=layout.tp_size, pp_rank=pp_rank, pp_size=layout.pp_size,
                   device=str(self.device), groups=layout.groups_of(args.rank))
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        with probe.phase(Phase.INIT_DISTRIBUTED):
            self.comm = Communicator(layout, args.rank, args.init_method, backend)
        with probe.phase(Phase.LOAD_WEIGHTS):
            source = resolve_model(config.model, config.load_format)
            self.runner = ModelRunner(source, self.comm, args.dtype, self.device, config)

    def kv_bytes_per_block(self) -> int:
        return self.runner.kv_bytes_per_block()

    def free_memory_bytes(self) -> int | None:
        if self.device.type != "cuda":
            return None
        free, _ = torch.cuda.mem_get_info(self.device)
        return free

    def init_kv_cache(self, num_blocks: int) -> None:
        with probe.phase(Phase.INIT_KV_CACHE):
            self.runner.init_kv_cache(num_blocks)

    def warmup(self) -> None:
        with probe.phase(Phase.WARMUP):
            self.runner.warmup()

    def execute_model(self, scheduler_output):
        with probe.phase(Phase.EXECUTE_MODEL, step=scheduler_output.step):
            return self.runner.execute_model(scheduler_output)


def _pick_device(args: WorkerArgs) -> torch.device:
    if args.device == "cuda":
        return torch.device("cuda", args.local_rank % torch.cuda.device_count())
    # A node's ranks share its cores, less one that the driver keeps: more threads each
    # only contend (on 2 cores, 2 threads for one rank made a serving step 10x slower).
    cores = len(os.sched_getaffinity(0))
    torch.set_num_threads(max(1, (cores - 1) // args.config.ranks_per_node))
    return torch.device("cpu")


def _exit_with_parent(parent_pid: int) -> None:
    """A worker must not outlive the driver, however the driver ended."""
    while True:
        if os.getppid() != parent_pid:
            os._exit(1)
        time.sleep(0.5)


def worker_main(args: WorkerArgs, reply_conn) -> None:
    name_this_process(engine_rank_name(args.rank))   # how diag attach finds the rank
    threading.Thread(target=_exit_with_parent, args=(args.parent_pid,), daemon=True).start()
    ring = ShmRing.attach(args.ring_handle)
    try:
        worker = Worker(args)
        try:
            _busy_loop(worker, ring, args, reply_conn)
        finally:
            worker.comm.close()
    except Exception:
        print(f"[rank {args.rank}] worker failed:\n{traceback.format_exc()}", file=sys.stderr,
              flush=True)
        sys.exit(1)
    finally:
        ring.release()


def _busy_loop(worker: Worker, ring: ShmRing, worker_args: WorkerArgs, reply_conn) -> None:
    """Until the ring closes. The dequeue phase's step is the engine step the rank
    expects next."""
    rank = worker_args.rank
    messages, next_step = 0, 0
    replies = Replies(reply_conn, overlap=WORKER_OVERLAP)
    while True:
        with probe.phase(Phase.DEQUEUE, step=next_step):
            message = _next_message(ring, worker_args.local_rank, replies)
        if message is None:
            replies.send_owed()
            return
        method, args, output_rank = message
        messages += 1
        probe.ring_read(messages)
        result = getattr(worker, method)(*args)
        if method == "execute_model":
            next_step = args[0].step + 1
        if output_rank is None or output_rank == rank:
            replies.send(result)


def _next_message(ring: ShmRing, reader: int, replies: "Replies") -> tuple | None:
    """The next (method, args, output_rank); None once the driver closed the ring,
    which is how a worker is told to stop (no error, so the probe records none).
    While it waits, a step owed to the driver goes as soon as its GPU is done."""
    try:
        return ring.dequeue(reader, should_abort=replies.send_owed_if_done,
                            fast_delay_s=replies.poll_s())
    except RingClosed:
        return None


class Replies:
    """The reply pipe. A step whose tokens are still on the GPU (a SampledStep with an
    event) is owed: it is sent before the next reply, once the next RPC has been
    launched, or as soon as its GPU is done while the busy loop waits for one."""

    def __init__(self, conn, overlap: bool):
        self.conn = conn
        self.overlap = overlap
        self.owed: SampledStep | None = None

    def send(self, result) -> None:
        self.send_owed()
        if self.overlap and isinstance(result, SampledStep) and result.done is not None:
            self.owed = result
        else:
            self.conn.send(result.output() if isinstance(result, SampledStep) else result)

    def send_owed(self) -> None:
        if self.owed is not None:
            owed, self.owed = self.owed, None
            with probe.phase(Phase.SAMPLE, step=owed.step):   # waits for its GPU
                output = owed.output()
            self.conn.send(output)

    def send_owed_if_done(self) -> None:
        if self.owed is not None and self.owed.done.query():
            self.send_owed()

    def poll_s(self) -> float | None:
        """How often to look at the ring: often while a step is owed, its next batch
        being on its way."""
        return 1e-4 if self.owed is not None else None
