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


def test_with_after_it_fires_once_at_the_first_call_that_finds_the_file(monkeypatch, tmp_path):
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    go = tmp_path / "go"
    execute = hs_test_faults._with_faults(
        Worker.execute_model, parse(f"rank=1,call=2,kind=raise,after={go}"))
    assert [execute(Worker(1), step) for step in (1, 2, 3)] == ["ran 1", "ran 2", "ran 3"]
    go.touch()
    with pytest.raises(RuntimeError, match="rank 1 raised at call 2"):   # the spec's call
        execute(Worker(1), 4)
    assert [execute(Worker(1), step) for step in (5, 6)] == ["ran 5", "ran 6"]


def test_with_after_it_skips_a_batch_of_no_tokens(monkeypatch, tmp_path):
    """vLLM's engine core sends empty batches with pp > 1: no peer would wait there."""
    monkeypatch.setattr(hs_test_faults, "_calls", 0)
    go = tmp_path / "go"
    go.touch()
    execute = hs_test_faults._with_faults(
        Worker.execute_model, parse(f"rank=1,call=1,kind=raise,after={go}"))
    empty, batch = SchedulerOutput(0), SchedulerOutput(3)
    assert execute(Worker(1), empty) == f"ran {empty}"
    with pytest.raises(RuntimeError, match="rank 1 raised at call 1"):
        execute(Worker(1), batch)


def test_it_is_inert_without_its_variable(monkeypatch):
    monkeypatch.delenv(hs_test_faults.VAR, raising=False)
    hs_test_faults.register()   # no vLLM here: it must return before importing it
