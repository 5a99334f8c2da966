"""For the people on call: one real hang of our engine at tp=2 pp=2 under `diag
launch --metrics-port --on-hang dump,kill:5,exec:HOOK` (tests/helpers/oncall_run.py),
watched as monitoring would: /health polled every 0.1 s, and a real Prometheus
(Debian's package) scraping /metrics every second with the shipped alert rules
(deploy/prometheus/hangscope-alerts.yml). The Prometheus checks skip, with the
reason, where the binary is missing; CI installs it."""
import json
import os

import pytest

from diagnose.launch.ending import ENDED_MARK
from helpers.oncall_run import run_hung
from helpers.prometheus_server import missing
from helpers.run import diag, left_behind

pytestmark = pytest.mark.e2e

FAULT_RANK, FAULT_STEP, KILL_AFTER_S = 3, 150, 5   # step 150: seconds of healthy scrapes first


@pytest.fixture(scope="module")
def hung(tmp_path_factory):
    watched = run_hung(str(tmp_path_factory.mktemp("oncall")), FAULT_RANK, FAULT_STEP,
                       KILL_AFTER_S)
    yield watched
    if watched.prometheus is not None:
        watched.prometheus.stop()


def test_health_is_200_while_healthy_and_503_within_3_s_of_the_hang(hung):
    fired_at = hung.fired_at
    healthy = [(at, text) for at, status, text in hung.health if status == 200]
    assert any(at < fired_at and "4 rank(s), no hang" in text for at, text in healthy)
    hung_answers = [(at, text) for at, status, text in hung.health if status == 503]
    assert hung_answers, f"no 503 from /health; diag said: {hung.stderr[-2000:]}"
    first_503, text = hung_answers[0]
    assert all(status == 503 for at, status, _ in hung.health if at >= first_503)
    assert first_503 - fired_at <= 3.0, f"503 came {first_503 - fired_at:.1f} s after the fault"
    assert text.startswith("hang: ") and f"rank {FAULT_RANK}" in text and text.count("\n") == 1


def test_prometheus_alert_fires_within_15_s_naming_the_culprit(hung):
    if hung.prometheus is None:
        pytest.skip(missing())
    assert hung.firing, f"HangscopeHang never fired; diag said: {hung.stderr[-2000:]}"
    seen_at, alert = hung.firing[0]
    assert alert["labels"]["culprit_rank"] == str(FAULT_RANK)
    assert seen_at - hung.fired_at <= 15.0, f"fired {seen_at - hung.fired_at:.1f} s after"
    [series] = hung.prometheus.query("hangscope_hang", at=seen_at)
    assert series["metric"]["culprit_rank"] == str(FAULT_RANK)
    assert series["metric"]["kind"] == alert["labels"]["kind"] and series["value"][1] == "1"
    before = hung.prometheus.query("hangscope_hung", at=hung.fired_at - 1)
    assert [sample["value"][1] for sample in before] == ["0"]


def test_dump_then_kill_after_5_s_leaves_stacks_dumps_report_and_no_process(hung):
    assert hung.returncode == 1, hung.stderr[-2000:]   # a verdict
    assert not left_behind(hung.run_dir)
    report = json.loads(open(os.path.join(hung.run_dir, "report.json")).read())
    ranks = {"0", "1", "2", "3"}
    assert set(report["stacks"]) >= ranks and set(report["py_spy"]) >= ranks
    assert set(report["flight_recorder"]) == ranks
    for path in report["flight_recorder"].values():
        assert os.path.getsize(os.path.join(hung.run_dir, path)) > 0
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE is deprecated" not in hung.stderr   # torch >= 2.9
    first_503 = hung.first_503
    assert hung.exited_at - first_503 >= KILL_AFTER_S, "the job was ended before its grace"
    lines = hung.stderr.splitlines()
    ended = [line for line in lines if ENDED_MARK in line]
    assert len(ended) == 1 and f"culprit rank {FAULT_RANK}" in ended[0]
    assert f"--on-hang dump,kill:{KILL_AFTER_S}" in ended[0]


def test_the_exec_hook_got_the_report_and_the_verdict(hung):
    with open(hung.hook_out) as f:
        report_path, verdict = f.read().split("\n", 1)
    assert report_path == os.path.abspath(os.path.join(hung.run_dir, "report.json"))
    assert f"rank {FAULT_RANK}" in verdict


def test_diag_analyze_reads_the_flight_recorder_dumps(hung):
    done = diag("analyze", hung.run_dir, "--json")
    recorded = json.loads(done.stdout)["flight_recorder"]
    assert recorded["ranks"] == [0, 1, 2, 3] and recorded["notes"] == []
