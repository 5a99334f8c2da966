"""Real vLLM (0.32, CPU build) with data parallelism under diag launch: two DP
ranks of one worker each (`--data-parallel-size 2`; the tiny Llama is dense, so
0.32 runs each DP rank as an independent engine core and its worker). DP is not
traced: vLLM numbers each DP rank's workers from 0, so their probe
files would share names. The engine core of DP rank 1 and its worker run
without the probe and say so in the report; DP rank 0 is traced as the whole
job it is. Faults come from the tests' own vLLM plugin (HS_TEST_FAULT, with
dp=D for the DP rank), inside the wrapped Worker.execute_model. What must hold:
no verdict on a healthy run, the one culprit where DP rank 0's worker hangs,
and no verdict (never a wrong one) where the untraced DP rank 1's does. The
runs end as a user's Ctrl-C ends them, through diag (docs/architecture.md says
why not through vLLM's own stop)."""
from __future__ import annotations

import pytest

from diagnose.cli.common import EXIT_INTERRUPTED, EXIT_VERDICTS
from helpers.vllm_faults import FaultRun, culprits, launch, plugin_missing, show

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(plugin_missing(), reason="real vLLM or the tests' "
                                 "fault plugin is not installed: run ./setup.sh --tests"),
              pytest.mark.timeout(1200)]
DP1_NOTE = ("vLLM data parallelism is not traced: EngineCore_DP1 and its workers "
            "ran without the probe")


def launch_dp2(tmp_path, checkpoint, cache, fault: str = "") -> FaultRun:
    return launch(tmp_path, checkpoint, cache, fault, tp=1, dp=2)


def probe_files(run: FaultRun) -> set[str]:
    return {path.name for path in run.run_dir.glob("*.probe")}


def test_dp2_dp_rank_0s_worker_asleep_inside_its_5th_step_is_the_one_culprit(
        tmp_path, checkpoint, cache):
    run = launch_dp2(tmp_path, checkpoint, cache, "rank=0,call=5,kind=sleep,dp=0")
    code = run.serve_until_done()
    report = run.report()
    show("dp2 dp 0 rank 0 sleeps at call 5", report)
    assert culprits(report) == [[0]], [v["summary"] for v in report["verdicts"]]
    assert "the driver waits on it" in report["verdicts"][0]["summary"]
    assert code == EXIT_VERDICTS, run.server.tail()
    assert probe_files(run) == {"driver.probe", "rank-0.probe"}


def test_dp2_untraced_dp_rank_1s_worker_asleep_is_no_verdict_and_only_dp_rank_0_is_traced(
        tmp_path, checkpoint, cache):
    """DP rank 1's worker sleeps 30 s inside its 3rd step (far past any stall
    limit); diag, which sees DP rank 0 only, says nothing of it. The run is the
    healthy one too: the traced DP rank 0 serves before and after the sleep, with
    no verdict, and only it has probe files and a row in the report."""
    run = launch_dp2(tmp_path, checkpoint, cache, "rank=0,call=3,kind=sleep,seconds=30,dp=1")
    run.start_requests()
    run.fired("rank 0 call 3: sleep done", 180)
    served, code = run.stop_through_diag(more=10, timeout=120)
    report = run.report()
    show("dp2 dp 1 rank 0 sleeps 30 s at call 3", report)
    assert served >= 10, run.server.tail()
    assert report["verdicts"] == []
    assert code == EXIT_INTERRUPTED, run.server.tail()
    assert DP1_NOTE in report["notes"], report["notes"]
    assert probe_files(run) == {"driver.probe", "rank-0.probe"}
    assert [row["rank"] for row in report["ranks"]] == [0]
