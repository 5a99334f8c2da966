"""The activity classifier on real stacks: py-spy dumps of real processes in known
states (tests/fixtures/pyspy/, made by tests/fixtures/make_pyspy_dumps.py), read
through the same parser the collector uses, and the table's own rules."""
from __future__ import annotations

import glob
import json
import os

import pytest

from diagnose.analysis.activity import ROWS, Classified, CompileSeen, Row, classify
from diagnose.core.vocab import Activity
from diagnose.launch.py_spy import threads_from_json

pytestmark = pytest.mark.unit

FIXTURES = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "fixtures", "pyspy",
                                         "*.json")))


def _main_frames(path: str) -> tuple[list[str], dict]:
    with open(path) as source:
        fixture = json.load(source)
    threads = threads_from_json(fixture["threads"])
    return next(iter(threads.values())), fixture


@pytest.mark.parametrize("path", FIXTURES, ids=os.path.basename)
def test_real_dump_is_classified_as_the_state_it_was_taken_in(path):
    frames, fixture = _main_frames(path)
    got = classify(frames)
    assert got.activity == Activity(fixture["expect"]), (fixture["what"], got)
    if got.activity != Activity.UNKNOWN:
        assert got.frame in frames


def test_the_fixtures_cover_every_state_a_cpu_process_can_be_caught_in():
    expected = {json.load(open(path))["expect"] for path in FIXTURES}
    assert {"collective", "idle", "compiling", "sleeping", "running"} <= expected


def test_native_frames_decide_only_where_python_frames_say_nothing():
    """Our engine's ring waits with time.sleep: the ring (what it waits for) wins
    over the sleep (how it waits), though the sleep is the inner frame."""
    frames = ["worker.py:130 _busy_loop", "worker/shm_ring.py:139 dequeue",
              "worker/shm_ring.py:42 wait", "[native] libpython3.11.so time_sleep",
              "[native] libc.so.6 clock_nanosleep"]
    assert classify(frames) == Classified(Activity.IDLE, "worker/shm_ring.py:139 dequeue",
                                          "engine-ring-read")
    assert classify(frames[:1] + frames[3:]).activity == Activity.SLEEPING


def test_the_innermost_deciding_row_wins():
    compiling_then_collective = ["_dynamo/convert_frame.py:10 _compile",
                                 "distributed/distributed_c10d.py:3252 all_reduce"]
    assert classify(compiling_then_collective).activity == Activity.COLLECTIVE
    collective_inside_compiled_code = ["_dynamo/eval_frame.py:800 _fn",
                                       "ab/cabc.py:40 call",
                                       "distributed/parallel_state.py:740 all_reduce"]
    assert classify(collective_inside_compiled_code).rule == "vllm-coordinator"


def test_a_compiled_graph_running_is_not_compiling():
    frames = ["runner/gpu_model_runner.py:10 execute_model", "_dynamo/eval_frame.py:800 _fn",
              "_inductor/output_code.py:600 __call__", "ab/cabc.py:40 call"]
    assert classify(frames) == Classified(Activity.RUNNING, "ab/cabc.py:40 call", None)


def test_qualified_and_bare_function_names_match_alike():
    """py-spy writes ShmRing.dequeue, the probe's own sampler dequeue."""
    bare = classify(["worker/shm_ring.py:139 dequeue"])
    qualified = classify(["worker/shm_ring.py:139 ShmRing.dequeue"])
    assert bare.activity == qualified.activity == Activity.IDLE


def test_no_frames_is_unknown_and_native_only_frames_run():
    assert classify([]) == Classified(Activity.UNKNOWN, None, None)
    assert classify(["[native] libfoo.so compute"]).activity == Activity.RUNNING


def test_a_new_release_is_a_new_row():
    row = Row("newlib", Activity.COLLECTIVE, "a new library's collective",
              file=r"newlib/comm\.py", function=r"allreduce")
    frames = ["main.py:1 <module>", "newlib/comm.py:9 Comm.allreduce"]
    assert classify(frames).activity == Activity.RUNNING
    assert classify(frames, ROWS + (row,)) == Classified(Activity.COLLECTIVE, frames[1], "newlib")


def test_row_names_are_unique_and_every_row_has_a_pattern():
    assert len({row.name for row in ROWS}) == len(ROWS)
    assert all(row.file or row.native for row in ROWS)


def test_a_compile_is_seen_until_the_first_sample_that_reads_another_stack():
    seen = CompileSeen()
    seen.add(Activity.RUNNING, 1.0, busy=True)
    assert (seen.since, seen.at) == (None, None)
    for at in (2.0, 3.0):
        seen.add(Activity.COMPILING, at, busy=True)
    assert (seen.since, seen.at) == (2.0, 3.0)
    seen.add(Activity.UNKNOWN, 4.0, busy=True)    # py-spy read nothing: the compile may go on
    assert (seen.since, seen.at) == (None, 4.0)
    seen.add(Activity.RUNNING, 5.0, busy=True)    # it ended between 4 and 5
    seen.add(Activity.RUNNING, 6.0, busy=True)
    seen.add(Activity.UNKNOWN, 7.0, busy=True)
    assert seen.at == 5.0


@pytest.mark.parametrize("busy,after_s,at", [(False, 1.0, 11.0), (True, 70.0, 80.0),
                                             (True, 1.0, 14.0)])
def test_an_unread_sample_holds_a_compile_only_while_busy_and_for_a_minute(busy, after_s, at):
    """A rank that cannot be read and is blocked, or has been unreadable for over
    UNREAD_COMPILE_S since its compile was last seen, compiles no more."""
    seen = CompileSeen()
    seen.add(Activity.COMPILING, 10.0, busy=True)
    seen.add(Activity.UNKNOWN, 10.0 + after_s, busy=busy)
    seen.add(Activity.UNKNOWN, 12.0 + after_s, busy=True)
    seen.add(Activity.UNKNOWN, 13.0 + after_s, busy=True)
    assert seen.at == at
