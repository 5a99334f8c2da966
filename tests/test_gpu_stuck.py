"""gpu_stuck on hand-built snapshots of a tp=2 job on GPUs: the host enqueues its
all-reduces and moves on to sampling, while the device of one rank never
reaches them (a kernel before them spins) and the other's waits inside them;
and of a tp=1 job, whose single GPU shows its stop only in the work of a step
phase (the probe's event as the host leaves it). The probe's side of that on
a fake device; the engine at tp=1 under diag launch on a real one (skipped
without a GPU)."""
import json
import os
import subprocess
import sys
import textwrap
from dataclasses import replace

import pytest

from helpers.collecting import collect
from diagnose.analysis import analyze, rewind
from diagnose.core.snapshot import DeviceWork
from helpers.synthetic import OP_S, Job

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def on_device(job, done_before):
    """Every record so far traced on the GPU, reached and finished when the host returned."""
    for state in job.ranks.values():
        state.collectives = [replace(record, device=True, t_device_start=record.t_enqueue,
                                     t_device_done=record.t_complete)
                             if record.t_complete is not None and record.t_complete <= done_before
                             else record for record in state.collectives]


def gpu_hang(now, rank_0_device_started=True):
    """Steps 0-1 healthy; in step 2 both hosts return from both all-reduces and
    block in sample (waiting on the GPU); rank 1's GPU spins before the first."""
    job = Job(tp=2, pp=1, now=now)
    t = job.healthy(2, job.everyone_started())
    on_device(job, t)
    job.driver_step(2, t, None)
    for rank, state in job.ranks.items():
        job.dequeue(rank, t, t + OP_S)
        state.ring_read += 1
        job.phase(state, "execute_model", t + OP_S, None, 2)
        job.phase(state, "forward", t + OP_S, t + 4 * OP_S, 2)
        for index in range(2):
            record = job.record(rank, "tp0", "all_reduce", t + (2 + index) * OP_S,
                                t + (2 + index) * OP_S + 0.001)
            record.device = True
        job.phase(state, "sample", t + 4 * OP_S, None, 2)
        state.frame = "engine/sampler.py:40 sample"
    first = job.ranks[0].collectives[-2]
    if rank_0_device_started:
        first.t_device_start = t + 2 * OP_S + 0.05
    job.fault(1, "rank=1,at=forward,step=2,kind=gpu_spin", t + OP_S)
    return job, t


def test_a_gpu_that_never_reaches_the_all_reduce_is_gpu_stuck_while_its_peer_waits_inside():
    job, t = gpu_hang(now=0.0)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert [verdict.kind for verdict in verdicts] == ["gpu_stuck"], [v.summary for v in verdicts]
    verdict = verdicts[0]
    assert verdict.culprit_ranks == [1] and verdict.victim_ranks == [0]
    assert (verdict.group, verdict.seq) == ("tp0", 4)
    assert 5.9 < verdict.detected_after_s < 6.1
    assert "the GPU has not reached tp0 all_reduce seq 4" in verdict.summary
    assert "the host is in sample" in verdict.summary
    assert "engine/sampler.py:40 sample" in verdict.summary
    device = verdict.evidence["device"]
    assert device["not_reached"]["seq"] == 4 and device["last_finished"]["seq"] == 3
    assert verdict.evidence["victims_on_device"] == {"0": "tp0 all_reduce seq 4"}


def test_gpu_stuck_waits_for_the_stall_limit():
    job, t = gpu_hang(now=0.0)
    job.now = t + 1.0
    assert analyze(job.snapshot()) == []


def test_a_peer_whose_gpu_has_not_reached_the_call_either_is_still_not_the_culprit_alone():
    """Both GPUs short of the call: each waits on its own GPU, so both are named."""
    job, t = gpu_hang(now=0.0, rank_0_device_started=False)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert sorted(verdict.culprit_ranks[0] for verdict in verdicts
                  if verdict.kind == "gpu_stuck") == [0, 1]


def test_device_times_after_the_rewind_point_are_forgotten():
    job, t = gpu_hang(now=0.0)
    job.now = t + 6.0
    record = job.ranks[0].collectives[-2]
    rewound = rewind(job.snapshot(), record.t_device_start - 0.01)
    assert rewound.ranks[0].collectives[-2].t_device_start is None
    assert rewound.ranks[0].collectives[-3].t_device_done is not None


def test_records_not_traced_on_the_gpu_keep_the_host_only_analysis():
    """A CPU job with the same host picture (calls returned, ranks in sample) has
    no device records: nobody waits in a collective, so no gpu_stuck."""
    job, t = gpu_hang(now=0.0)
    for state in job.ranks.values():
        state.collectives = [replace(record, device=False, t_device_start=None,
                                     t_device_done=None) for record in state.collectives]
    job.now = t + 6.0
    assert "gpu_stuck" not in [verdict.kind for verdict in analyze(job.snapshot())]


def test_a_rank_whose_host_went_back_to_dequeue_is_still_gpu_stuck():
    """Only the output rank syncs in sample: rank 1's host finishes the step and
    waits for the next broadcast, while its GPU never reached the all-reduce."""
    job, t = gpu_hang(now=0.0)
    state = job.ranks[1]
    for event in list(state.open_phases):
        event.end = t + 5 * OP_S
        state.open_phases.remove(event)
    job.dequeue(1, t + 6 * OP_S)
    job.now = t + 6.0
    verdicts = analyze(job.snapshot())
    assert [(v.kind, v.culprit_ranks) for v in verdicts] == [("gpu_stuck", [1])]
    assert "the host is in dequeue" in verdicts[0].summary


def single_gpu_hang(now_after: float):
    """tp=1 on a GPU: steps 0-3 healthy; in step 4 the host leaves forward (its
    kernels enqueued) and blocks in sample on the tokens, while the GPU spins
    before forward's work."""
    job = Job(tp=1, pp=1)
    t = job.healthy(4, job.everyone_started())
    job.driver_step(4, t, None)
    state = job.ranks[0]
    job.dequeue(0, t, t + OP_S)
    job.phase(state, "execute_model", t + OP_S, None, 4)
    job.phase(state, "forward", t + OP_S, t + 3 * OP_S, 4)
    job.phase(state, "sample", t + 3 * OP_S, None, 4)
    state.frame = "engine/sampler.py:27 sample"
    state.device_done_at = t - OP_S                       # step 3's work, seen finished
    state.device_pending = DeviceWork("forward", 4, t + 3 * OP_S)
    job.fault(0, "rank=0,at=forward,step=4,kind=gpu_spin", t + OP_S)
    job.now = t + 3 * OP_S + now_after
    return job


def test_a_single_gpu_that_stopped_in_a_steps_work_is_gpu_stuck_not_the_host_in_sample():
    [verdict] = analyze(single_gpu_hang(6.0).snapshot())
    assert (verdict.kind, verdict.culprit_ranks, verdict.step) == ("gpu_stuck", [0], 4)
    assert verdict.summary == (
        "rank 0 (pp 0/1, tp 0): the GPU has not finished the work of forward at step 4, which "
        "the host left 6 s ago; the host is in sample at step 4 at "
        "engine/sampler.py:27 sample; the driver waits on it")
    assert verdict.evidence["device"]["not_finished"]["phase"] == "forward"
    assert 5.9 < verdict.detected_after_s < 6.1


def test_a_rank_whose_agent_holds_its_rings_back_is_not_judged_by_its_gpu_work():
    """Its host moved 0.3 s ago: the phase whose limit applies is unknown."""
    job = single_gpu_hang(6.0)
    job.ranks[0].progress_at = job.now - 0.3
    assert analyze(job.snapshot()) == []


def test_a_single_gpu_is_given_the_stall_limit_too():
    assert analyze(single_gpu_hang(1.0).snapshot()) == []


def test_a_host_stuck_with_its_gpu_done_is_still_the_host():
    job = single_gpu_hang(6.0)
    job.ranks[0].device_pending = None
    [verdict] = analyze(job.snapshot())
    assert (verdict.kind, verdict.culprit_ranks) == ("stuck_in_phase", [0])


def test_a_rank_in_a_traced_collective_is_left_to_the_collectives_progress():
    """tp=2: both GPUs are short of forward's end, one because it spins, the other
    because it waits inside the all_reduce on the first: only the first is named."""
    job, t = gpu_hang(now=0.0)
    for state in job.ranks.values():
        state.device_pending = DeviceWork("forward", 2, t + 4 * OP_S)
    job.now = t + 6.0
    assert [(v.kind, v.culprit_ranks) for v in analyze(job.snapshot())] == [("gpu_stuck", [1])]


STEP_WORK_CHILD = """
    import sys, time
    from diagnose.probe.recorder import Recorder

    class Event:                 # stands for torch.cuda.Event: done once the GPU got there
        done = False
        def record(self):
            pass
        def query(self):
            return self.done

    identity = {"role": "worker", "rank": 0, "world_size": 1, "tp_rank": 0, "tp_size": 1,
                "pp_rank": 0, "pp_size": 1, "host": "h", "pid": 0, "device": "cpu"}
    probe = Recorder(sys.argv[1], identity)
    probe.on_device, probe.new_event = True, Event
    probe.capturing, probe.set_device = (lambda: False), (lambda device: None)
    with probe.device_lock:      # no poll while the phases are made
        for step in (3, 4):
            for name in ("dequeue", "forward", "sample"):
                probe.exit_phase(probe.enter_phase(name, step), name, step)
        for work in list(probe.step_work)[:2]:
            work.event.done = True                # step 3's forward and sample
    for answer in ("polled", "finished"):
        time.sleep(0.5)
        print(answer, flush=True)
        sys.stdin.readline()
        for work in list(probe.step_work):
            work.event.done = True
"""


def test_the_probe_publishes_the_oldest_step_work_its_gpu_has_not_finished(tmp_path):
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(STEP_WORK_CHILD))
    run_dir = tmp_path / "run"
    child = subprocess.Popen([sys.executable, str(script), str(run_dir)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": REPO})
    try:
        assert child.stdout.readline() == "polled\n"
        state = collect(str(run_dir)).ranks[0]
        assert (state.device_pending.phase, state.device_pending.step) == ("forward", 4)
        assert state.device_done_at is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline() == "finished\n"
        state = collect(str(run_dir)).ranks[0]
        assert state.device_pending is None and state.device_done_at is not None
    finally:
        child.kill()
        child.wait()


def needs_a_gpu():
    import torch
    return pytest.mark.skipif(not torch.cuda.is_available(),
                              reason="needs a CUDA GPU: the probe watches the device's progress")


@needs_a_gpu()
def test_a_single_gpu_spinning_in_the_forward_of_step_4_is_gpu_stuck(tmp_path):
    """The engine at tp=1 under diag launch; rank 0's GPU spins before the forward
    of step 4 while its host goes on to sample and blocks there."""
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "diagnose.cli", "launch", "--on-hang", "kill",
               "--run-dir", str(tmp_path / "run"), "-o", str(report),
               "--fault", "rank=0,at=forward,step=4,kind=gpu_spin", "--",
               sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "1",
               "--device", "cuda", "--dtype", "bfloat16", "--ignore-eos", "--max-tokens", "32",
               "--prompt", "Where does the GPU stop?"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": REPO})
    verdicts = json.loads(report.read_text())["verdicts"]
    assert [(v["kind"], v["culprit_ranks"]) for v in verdicts][:1] == [("gpu_stuck", [0])], \
        done.stderr[-3000:]
    stuck = verdicts[0]["evidence"]["device"]["not_finished"]
    assert (stuck["phase"], stuck["step"]) == ("forward", 4)
    assert "the host is in sample" in verdicts[0]["summary"]
    assert verdicts[0]["detected_after_s"] <= 5
