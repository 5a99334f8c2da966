"""Fault specs: parsing, and each kind firing in a real process at the right phase entry."""
from __future__ import annotations

import signal

import pytest

from helpers.collecting import collect, rank_in_phase
from diagnose.probe.faults import FaultPlan, FaultSpec, FaultSpecError, parse_faults
from helpers.run import wait_for


def test_specs_parse_and_print_back():
    spec = FaultSpec.parse("rank=3,at=execute_model,step=5,kind=hang")
    assert spec == FaultSpec(rank=3, at="execute_model", kind="hang", step=5)
    assert str(spec) == "rank=3,at=execute_model,step=5,kind=hang"
    driver, exiting = parse_faults(" kind=sleep:1.5, at=schedule, rank=driver ;"
                                   "rank=0,at=forward,kind=exit:3;")
    assert (driver.rank, driver.kind, driver.arg, driver.step) == (None, "sleep", 1.5, None)
    assert str(driver) == "rank=driver,at=schedule,kind=sleep:1.5"
    assert (exiting.kind, exiting.arg) == ("exit", 3)


@pytest.mark.parametrize("text, message", [
    ("rank=1,at=forward", "missing kind"),
    ("forward", "is not key=value"),
    ("rank=1,at=forward,kind=hang,when=now", "unknown key 'when'"),
    ("rank=1,rank=2,at=forward,kind=hang", "rank given twice"),
    ("rank=-1,at=forward,kind=hang", "rank must be a number"),
    ("rank=1,at=fwd,kind=hang", "unknown phase 'fwd'"),
    ("rank=1,at=forward,step=x,kind=hang", "step must be a number"),
    ("rank=1,at=forward,kind=explode", "unknown kind 'explode'"),
    ("rank=1,at=forward,kind=sleep:soon", "sleep needs a finite number of seconds > 0"),
    ("rank=1,at=forward,kind=sleep", "sleep needs a finite number of seconds > 0"),
    ("rank=1,at=forward,kind=sleep:inf", "sleep needs a finite number of seconds > 0"),
    ("rank=1,at=forward,kind=sleep:nan", "sleep needs a finite number of seconds > 0"),
    ("rank=1,at=forward,kind=exit:300", "exit needs a code 0..255"),
    ("rank=1,at=forward,kind=hang:3", "kind hang takes no argument"),
])
def test_bad_specs_say_what_is_wrong(text, message):
    with pytest.raises(FaultSpecError, match=message):
        FaultSpec.parse(text)


def test_a_fault_fires_once_at_its_step():
    plan = FaultPlan(parse_faults("rank=0,at=forward,step=2,kind=hang;rank=0,at=sample,kind=crash"))
    assert plan.due("forward", 0) is None
    assert plan.due("sample", 0).kind == "crash"
    assert plan.due("sample", 1) is None
    assert plan.due("forward", 2).kind == "hang"
    assert plan.due("forward", 2) is None


FAULTED_CHILD = """
    import sys, time
    from diagnose import probe

    probe.init("worker", rank=0, world_size=1)
    if sys.argv[1:] == ["collectives"]:
        import torch
        x = torch.ones(2, 2)
    for step in range(4):
        with probe.phase("dequeue", step=step):
            pass
        probe.ring_read(step + 1)
        with probe.phase("execute_model", step=step):
            with probe.phase("forward", step=step):
                if sys.argv[1:] == ["collectives"]:
                    with probe.collective("tp0", "all_reduce", [x]) as record:
                        print(step, record.skip, flush=True)
    print("done", flush=True)
"""


def beat_since(run_dir, state, seconds: float):
    """Rank 0's state once its heartbeat is `seconds` newer than in `state`, else None."""
    later = collect(str(run_dir)).ranks[0]
    return later if later.heartbeat_at > state.heartbeat_at + seconds else None


def faulted(spawn, spec: str, *args: str):
    return spawn(FAULTED_CHILD, *args, env={"DIAG_FAULT": spec})


def test_hang_blocks_before_the_phase_and_the_heartbeat_goes_on(spawn, run_dir):
    child = faulted(spawn, "rank=0,at=forward,step=2,kind=hang")
    state = wait_for(lambda: rank_in_phase(run_dir, 0, "execute_model", 2), what="the hang")
    later = wait_for(lambda: beat_since(run_dir, state, 0.3), what="heartbeats during the hang")
    assert child.poll() is None and later.alive
    assert later.phase.name == "execute_model" and later.phase.step == 2
    assert [p.step for p in later.phases if p.name == "forward"] == [0, 1]
    assert later.fault.spec == "rank=0,at=forward,step=2,kind=hang"
    assert later.fault.fired_at is not None
    assert later.frame.endswith(" block_forever")


def test_exit_fires_at_the_named_step_with_its_code(spawn, run_dir):
    child = faulted(spawn, "rank=0,at=execute_model,step=3,kind=exit:7")
    assert child.wait(timeout=30) == 7
    state = collect(str(run_dir)).ranks[0]
    assert not state.alive
    assert state.fault.fired_at is not None
    assert [p.step for p in state.phases if p.name == "execute_model"] == [0, 1, 2]
    assert state.open_phases == []


def test_crash_kills_the_rank_with_sigkill(spawn, run_dir):
    child = faulted(spawn, "rank=0,at=forward,kind=crash")
    assert child.wait(timeout=30) == -signal.SIGKILL
    state = collect(str(run_dir)).ranks[0]
    assert [(p.name, p.step) for p in state.open_phases] == [("execute_model", 0)]
    assert state.fault.fired_at is not None


def test_sleep_delays_the_phase_then_goes_on(spawn, run_dir):
    child = faulted(spawn, "rank=0,at=forward,step=1,kind=sleep:0.6")
    assert child.wait(timeout=30) == 0
    phases = {(p.name, p.step): p for p in collect(str(run_dir)).ranks[0].phases}
    assert phases["forward", 1].start - phases["execute_model", 1].start >= 0.6
    assert phases["forward", 2].start - phases["execute_model", 2].start < 0.3


def test_a_fault_for_another_rank_does_nothing(spawn, run_dir):
    child = faulted(spawn, "rank=1,at=forward,kind=crash")
    assert child.wait(timeout=30) == 0
    assert collect(str(run_dir)).ranks[0].fault is None


def test_skip_collective_skips_the_next_call_without_a_sequence_number(spawn, run_dir):
    child = faulted(spawn, "rank=0,at=forward,step=1,kind=skip_collective", "collectives")
    out, _ = child.communicate(timeout=60)
    assert out.split("\n")[:5] == ["0 False", "1 True", "2 False", "3 False", "done"]
    records = collect(str(run_dir)).ranks[0].collectives
    assert [r.seq for r in records] == [0, 1, 2]
    assert records[1].t_enqueue > collect(str(run_dir)).ranks[0].fault.fired_at


def test_skip_broadcast_blocks_in_dequeue_without_reading(spawn, run_dir):
    faulted(spawn, "rank=0,at=dequeue,step=2,kind=skip_broadcast")
    state = wait_for(lambda: rank_in_phase(run_dir, 0, "dequeue", 2), what="dequeue step 2")
    state = wait_for(lambda: beat_since(run_dir, state, 0.3), what="heartbeats in dequeue")
    assert (state.phase.name, state.phase.step, state.ring_read) == ("dequeue", 2, 2)
    assert state.alive and state.fault.fired_at is not None
