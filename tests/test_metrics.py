"""/metrics and /health of `diag launch --metrics-port`, served over real HTTP from
recorded run dirs: the hang's labels, Prometheus' naming rules (promtool's own
linter, where Debian's prometheus package is installed), and the health answer."""
import os
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

from diagnose.analysis import analyze
from diagnose.launch.collector import Collector
from diagnose.launch.ending import verdict_key
from diagnose.launch.metrics import Monitor

pytestmark = pytest.mark.unit

RUNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures", "runs")


@pytest.fixture
def monitor():
    served = Monitor("127.0.0.1", 0)
    yield served
    served.close()


def publish(monitor: Monitor, run: str) -> None:
    snapshot = Collector(os.path.join(RUNS, run)).snapshot()
    monitor.publish(snapshot, analyze(snapshot), verdict_key, 0.01)


def get(monitor: Monitor, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(monitor.url + path, timeout=5) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def samples(text: str) -> dict[str, str]:
    return dict(line.rsplit(" ", 1) for line in text.splitlines() if not line.startswith("#"))


def test_a_hang_is_a_labelled_gauge_a_counter_and_a_503(monitor):
    publish(monitor, "rank6_never_reached")
    status, text = get(monitor, "/metrics")
    found = samples(text)
    assert status == 200 and found["hangscope_hung"] == "1.0"
    assert found['hangscope_hang{culprit_rank="6",kind="never_reached"}'] == "1.0"
    assert found['hangscope_verdicts_total{kind="never_reached"}'] == "1.0"
    assert found["hangscope_ranks"] == "8.0"
    assert {f'hangscope_rank_alive{{rank="{rank}"}}' for rank in range(8)} <= set(found)
    publish(monitor, "rank6_never_reached")      # the same hang again: counted once
    assert samples(get(monitor, "/metrics")[1])[
        'hangscope_verdicts_total{kind="never_reached"}'] == "1.0"
    status, line = get(monitor, "/health")
    assert status == 503 and line.startswith("hang: never_reached: rank 6 ")
    assert line.count("\n") == 1


def test_healthy_is_200_and_no_hang_series(monitor):
    assert get(monitor, "/health") == (200, "ok: no rank has started yet\n")
    publish(monitor, "no_fault")
    status, text = get(monitor, "/metrics")
    assert samples(text)["hangscope_hung"] == "0.0" and "hangscope_hang{" not in text
    status, line = get(monitor, "/health")
    assert status == 200 and line.startswith("ok: ")
    assert get(monitor, "/nothing")[0] == 404


def test_the_names_pass_promtools_linter(monitor):
    if shutil.which("promtool") is None:
        pytest.skip("no promtool: apt-get install prometheus (.ci/run installs it)")
    publish(monitor, "rank6_never_reached")
    linted = subprocess.run(["promtool", "check", "metrics"], input=get(monitor, "/metrics")[1],
                            capture_output=True, text=True, timeout=30)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_a_taken_port_is_one_line(monitor):
    from diagnose.launch.metrics import MonitorError
    port = int(monitor.url.rsplit(":", 1)[1])
    with pytest.raises(MonitorError, match=f"cannot listen on 127.0.0.1:{port}"):
        Monitor("127.0.0.1", port)


def test_the_alert_rules_pass_promtool():
    if shutil.which("promtool") is None:
        pytest.skip("no promtool: apt-get install prometheus (.ci/run installs it)")
    rules = os.path.join(os.path.dirname(RUNS), "..", "..", "deploy", "prometheus",
                         "hangscope-alerts.yml")
    checked = subprocess.run(["promtool", "check", "rules", rules], capture_output=True,
                             text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr
