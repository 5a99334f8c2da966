"""A host starved for CPU: the real engine (tp=2 pp=2, gloo) under `diag launch`
while 4 busy loops per CPU, each in a session of its own, take the cores from
the job's first step to its end (helpers/starve.py). A healthy job gives no
verdict; a hang that spins is still named, later, with the time it waited for
a CPU and the host's load in its evidence.
benchmarks/stress_loaded_host.py runs both many times, beside the old limits."""
import json
import os
import sys

import pytest
from helpers.run import launch_process, left_behind, wait_for
from helpers.starve import Starved

from diagnose.core.vocab import Phase
from diagnose.launch.collector import Collector

pytestmark = pytest.mark.e2e

PROMPTS = ["--prompt", "Where does the pipeline stop?", "--prompt", "Which rank is late?"]


def engine(*args: str) -> list[str]:
    return [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
            "-pp", "2", "--ignore-eos", *args]


def launch_starved(run_dir, command, *flags, timeout: float = 120) -> dict:
    """`diag launch --on-hang kill` of `command`, the host starved from its first
    step on; the report, with diag's exit code and stderr and PSI's cpu "some"
    share while starved (None without PSI)."""
    proc = launch_process(run_dir, command, "--on-hang", "kill", *flags)
    try:
        collector = Collector(str(run_dir))
        wait_for(lambda: proc.poll() is not None or stepping(collector), timeout=60,
                 what="the job's first step", every=0.2)
        with Starved() as starved:
            _, err = proc.communicate(timeout=timeout)
            pressure = starved.pressure()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert not left_behind(run_dir), f"processes of {run_dir} are still alive"
    report = json.loads((run_dir / "report.json").read_text())
    return {**report, "exit_code": proc.returncode, "stderr": err, "pressure": pressure}


def stepping(collector: Collector) -> bool:
    return os.path.isdir(collector.run_dir) and any(
        event.name == Phase.EXECUTE_MODEL
        for state in collector.snapshot().ranks.values() for event in state.phases)


def test_a_healthy_job_on_a_starved_host_gives_no_verdict(tmp_path):
    """Long prompts in 16-token chunks: many steps, each far longer while starved."""
    prompts = []
    for i in range(4):
        prompts += ["--prompt", f"request {i}: " + "a long prompt that needs many chunks " * 3]
    body = launch_starved(tmp_path / "run", engine(*prompts, "--max-tokens", "8",
                                                   "--max-num-batched-tokens", "16"))
    assert body["pressure"] is None or body["pressure"] > 0.9   # the host was starved
    assert body["verdicts"] == [] and body["exit_code"] == 0, body["stderr"][-3000:]


def test_a_hang_that_spins_on_a_starved_host_is_named_later(tmp_path):
    """Rank 1 loops forever on the CPU in forward: it waits for a core like a
    healthy rank, so its limit stretches by that wait, never past 10 x 2 s."""
    body = launch_starved(tmp_path / "run", engine(*PROMPTS, "--max-tokens", "8"),
                          "--fault", "rank=1,at=forward,step=1,kind=spin")
    assert [(v["kind"], v["culprit_ranks"]) for v in body["verdicts"]] == [
        ("stuck_in_phase", [1])], body["stderr"][-3000:]
    verdict = body["verdicts"][0]
    waited = verdict["evidence"]["cpu_wait"]["1"]
    assert waited["cpu_waited_s"] > 0.5 and waited["stretched_limit_s"] > waited["limit_s"]
    assert verdict["detected_after_s"] <= 10 * waited["limit_s"] + 5
    assert verdict["evidence"]["host"]["load_per_cpu"] > 0
    assert body["exit_code"] == 1
