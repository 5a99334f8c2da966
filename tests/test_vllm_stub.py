"""The vLLM plugin on a release that lacks names it hooks. The release is a STUB:
a `vllm` package this test writes (tests/programs/vllm_stub.py's modules), with
vLLM's module layout and process names but without several of the names that
HOOKS in diagnose/probe/vllm.py wraps. A stub because no real release lacks
exactly these names, and a real one takes minutes to start; the real releases
are run by benchmarks/vllm_matrix.py and test_vllm.py. The job is real: `diag
launch` around an engine core and two worker processes that import the stub as
vLLM's own processes import vLLM."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from diagnose.core.vocab import Phase
from diagnose.launch.collector import Collector
from diagnose.probe import vllm as plugin
from diagnose.probe.vllm_hooks import WORKER_CLASS
from helpers.run import diag

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "tests" / "programs" / "vllm_stub.py"
VERSION = "0.9.9"
# What the stub leaves out, each a row of the table whose loss is noted.
# (No FutureWrapper is no note: blocking calls wait inside collective_rpc, which is hooked.)
MISSING = ["MultiprocExecutor.start_worker_monitor",
           "WorkerProc.worker_busy_loop", "GroupCoordinator.all_gather",
           "determine_available_memory", "compile_or_warm_up_model"]


def test_missing_names_are_notes_in_the_report_and_the_job_runs(tmp_path):
    subprocess.run([sys.executable, str(STUB), "--write", str(tmp_path / "stub"), VERSION],
                   check=True, timeout=30)
    run_dir = tmp_path / "run"
    done = diag("launch", "--run-dir", run_dir, "--", sys.executable, STUB, "--serve",
                tmp_path / "stub")
    report = json.loads((run_dir / "report.json").read_text())
    assert "stub served 3 steps" in (run_dir / "output.log").read_text(), done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    assert report["verdicts"] == []
    notes = report["notes"]
    for name in MISSING:
        assert [note for note in notes if f"vLLM {VERSION}: no {name};" in note], (name, notes)
    assert sum("outside the releases hangscope was tested with" in note for note in notes) == 1
    # what the stub has is hooked: the workers' steps and the engine core's waits are phases
    assert not [note for note in notes if "no load_model" in note or "no execute_model" in note]
    assert len(notes) == len(set(notes))
    ranks = Collector(str(run_dir)).snapshot().ranks
    assert [ranks[rank].identity.label for rank in (0, 1)] == ["Worker_TP0", "Worker_TP1"]
    assert ranks[1].identity.groups == {"tp0": [0, 1], "pp": [0, 1]}


def serve_as_dp_rank(tmp_path, dp_rank: int) -> tuple[dict, Path]:
    """The stub as the engine core of DP rank `dp_rank` of 2, under diag launch:
    the report and the run dir."""
    subprocess.run([sys.executable, str(STUB), "--write", str(tmp_path / "stub"), VERSION],
                   check=True, timeout=30)
    run_dir = tmp_path / "run"
    done = diag("launch", "--run-dir", run_dir, "--", sys.executable, STUB, "--serve",
                tmp_path / "stub", str(dp_rank), "2")
    assert "stub served 3 steps" in (run_dir / "output.log").read_text(), done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads((run_dir / "report.json").read_text()), run_dir


def test_an_engine_core_of_dp_rank_1_and_its_workers_are_not_traced_and_say_so(tmp_path):
    report, run_dir = serve_as_dp_rank(tmp_path, 1)
    assert report["verdicts"] == []
    assert list(run_dir.glob("*.probe")) == []
    assert ("vLLM data parallelism is not traced: EngineCore_DP1 and its workers "
            "ran without the probe") in report["notes"], report["notes"]


def test_dp_rank_0_whose_config_is_dps_enters_no_phase_and_its_workers_are_not_traced(
        tmp_path):
    """Where the engine core's config keeps its DP size (0.11, a MoE model), DP rank
    0's probe began before the config was known: it stays, idle, so that nothing
    waits on workers it cannot see."""
    report, run_dir = serve_as_dp_rank(tmp_path, 0)
    assert report["verdicts"] == []
    assert sorted(path.name for path in run_dir.glob("*.probe")) == ["driver.probe"]
    driver = Collector(str(run_dir)).snapshot().driver
    assert {event.name for event in driver.phases} <= {Phase.SHUTDOWN, Phase.EXIT}, driver.phases
    assert driver.ring_written == 0
    assert ("vLLM data parallelism is not traced: EngineCore_DP0 and its workers "
            "ran without the probe") in report["notes"], report["notes"]


def test_every_row_names_what_it_records_and_its_releases():
    for hook in plugin.HOOKS:
        assert hook.records and hook.releases, hook
        assert hook.module == WORKER_CLASS or hook.module.startswith("vllm.")
