"""The tests' own vLLM fault plugin (tests/vllm_env/faultplugin), without vLLM:
its spec, and that the wrapper fires on the chosen rank at the chosen call only.
A plugin that fired at the wrong call would make every vLLM test of issue #24
test something else."""
from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parent / "vllm_env" / "faultplugin"))
import hs_test_faults  # noqa: E402
from hs_test_faults import Fault, parse  # noqa: E402

pytestmark = pytest.mark.unit


class Worker:
    """What the wrapper reads of vLLM's Worker: its rank in its DP rank, and the DP
    rank of its parallel config (0.32 keeps a dense model's in data_parallel_index)."""
    def __init__(self, rank: int, dp: int = 0):
        self.rank = rank
        self.parallel_config = SimpleNamespace(data_parallel_rank=0, data_parallel_index=dp)

    def execute_model(self, output):
        return f"ran {output}"


class SchedulerOutput:
    """What the wrapper reads of vLLM's SchedulerOutput: how many tokens it runs."""
    def __init__(self, tokens: int):
        self.total_num_scheduled_tokens = tokens

    def __str__(self) -> str:
        return f"{self.total_num_scheduled_tokens} tokens"


def test_a_spec_of_several_faults_is_read_whole():
    assert parse("rank=1,call=3,kind=sleep;rank=2,call=30,kind=assert,seconds=5") == [
        Fault(1, 3, "sleep"), Fault(2, 30, "assert", 5.0)]
    assert parse("rank=0,call=3,kind=compile,seconds=30") == [Fault(0, 3, "compile", 30.0)]


@pytest.mark.parametrize("spec", ["rank=1,call=3", "rank=1,call=3,kind=explode",
                                  "call=3,kind=raise"])
def test_a_malformed_spec_is_named(spec):
    with pytest.raises(ValueError, match="HS_TEST_FAULT"):
        parse(spec)


def test_it_raises_on_its_rank_at_its_call_and_nowhere_else(monkeypatch):
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    execute = hs_test_faults._with_faults(Worker.execute_model, parse("rank=1,call=3,kind=raise"))
    assert [execute(Worker(1), step) for step in (1, 2)] == ["ran 1", "ran 2"]
    with pytest.raises(RuntimeError, match="rank 1 raised at call 3"):
        execute(Worker(1), 3)
    assert execute(Worker(1), 4) == "ran 4"
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    assert [execute(Worker(0), step) for step in (1, 2, 3)] == ["ran 1", "ran 2", "ran 3"]


def test_with_dp_it_fires_on_that_dp_ranks_worker_only(monkeypatch):
    """vLLM numbers each DP rank's workers from 0: without dp=, DP rank 0's."""
    execute = hs_test_faults._with_faults(Worker.execute_model,
                                          parse("rank=0,call=2,kind=raise,dp=1"))
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    assert [execute(Worker(0), step) for step in (1, 2)] == ["ran 1", "ran 2"]
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    assert execute(Worker(0, dp=1), 1) == "ran 1"
    with pytest.raises(RuntimeError, match="rank 0 raised at call 2"):
        execute(Worker(0, dp=1), 2)
    assert parse("rank=0,call=2,kind=raise") == [Fault(0, 2, "raise")]


def test_with_after_it_fires_once_at_the_call_after_the_one_that_found_the_file(
        monkeypatch, tmp_path):
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    go = tmp_path / "go"
    execute = hs_test_faults._with_faults(
        Worker.execute_model, parse(f"rank=1,call=2,kind=raise,after={go}"))
    assert [execute(Worker(1), step) for step in (1, 2, 3)] == ["ran 1", "ran 2", "ran 3"]
    go.touch()
    assert execute(Worker(1), 4) == "ran 4"
    with pytest.raises(RuntimeError, match="rank 1 raised at call 2"):   # the spec's call
        execute(Worker(1), 5)
    assert [execute(Worker(1), step) for step in (6, 7)] == ["ran 6", "ran 7"]
    assert sorted(path.name for path in tmp_path.iterdir()) == ["go", "go.call"]


def test_with_after_tp_peers_that_looked_before_and_after_the_file_fire_at_one_call(
        monkeypatch, tmp_path):
    """The CI run this mends: rank 2 looked at call 52 before the test made the
    file, rank 3 after it; rank 3 asserted in step 52 and rank 2 waited in it.
    Each rank is a process of its own in vLLM: here each keeps its own count."""
    go = tmp_path / "go"
    faults = parse(f"rank=2,call=4,kind=assert,after={go};rank=3,call=4,kind=assert,after={go}")
    execute = hs_test_faults._with_faults(Worker.execute_model, faults)
    counts, fired = {2: (51, set()), 3: (51, set())}, {}

    def step(rank: int, call: int) -> None:
        monkeypatch.setattr(hs_test_faults, "_calls", counts[rank][0])
        monkeypatch.setattr(hs_test_faults, "_fired", counts[rank][1])
        try:
            execute(Worker(rank), call)
        except AssertionError:
            fired[rank] = call
        counts[rank] = (hs_test_faults._calls, hs_test_faults._fired)

    step(2, 52)
    go.touch()
    step(3, 52)
    for call in (53, 54):
        step(2, call)
        step(3, call)
    assert fired == {2: 53, 3: 53}


def test_with_after_it_skips_a_batch_of_no_tokens(monkeypatch, tmp_path):
    """vLLM's engine core sends empty batches with pp > 1: no peer would wait there."""
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    go = tmp_path / "go"
    go.touch()
    execute = hs_test_faults._with_faults(
        Worker.execute_model, parse(f"rank=1,call=1,kind=raise,after={go}"))
    empty, batch = SchedulerOutput(0), SchedulerOutput(3)
    assert execute(Worker(1), empty) == f"ran {empty}"
    assert execute(Worker(1), batch) == f"ran {batch}"      # finds the file: call 3 on
    assert execute(Worker(1), empty) == f"ran {empty}"
    with pytest.raises(RuntimeError, match="rank 1 raised at call 1"):
        execute(Worker(1), batch)


def test_it_is_inert_without_its_variable(monkeypatch):
    monkeypatch.delenv(hs_test_faults.VAR, raising=False)
    hs_test_faults.register()   # no vLLM here: it must return before importing it
