"""diag launch owns its run dir and its job: a second launch on a live run dir
is refused untouched; Ctrl-C and SIGTERM stop the run with one line, a report
and the stop recorded (which diag analyze does not take for a death); and a
SIGKILLed launcher leaves no process of its job behind."""
import json
import os
import signal
import sys
import time

import pytest

from diagnose.launch.collector import Collector
from diagnose.analysis.position import current_step
from helpers.collecting import collect
from helpers.run import PROGRAMS, diag, diag_process, left_behind, wait_for

ENDING = os.path.join(PROGRAMS, "ending.py")
STEPS = [sys.executable, ENDING, "steps"]
ENGINE_TP2 = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
              "--prompt", "hi", "--max-tokens", "100000", "--ignore-eos"]


def driver_started(run_dir) -> bool:
    return (run_dir / "driver.probe").exists()


def driver_stepping(run_dir, steps: int) -> bool:
    """The driver has taken `steps` steps of ending.py's: the job is at work."""
    if not driver_started(run_dir):
        return False
    driver = collect(str(run_dir)).driver
    return driver is not None and (current_step(driver) or 0) >= steps


@pytest.fixture
def launches():
    started = []

    def launch(*argv):
        started.append(diag_process(*argv))
        return started[-1]
    yield launch
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def test_a_second_launch_on_a_live_run_dir_is_refused_and_touches_nothing(tmp_path, launches):
    run_dir = tmp_path / "run"
    first = launches("launch", "--run-dir", str(run_dir), "--", *STEPS)
    wait_for(lambda: driver_started(run_dir), 60, what="driver.probe")
    launch_json = (run_dir / "launch.json").read_text()
    second = diag("launch", "--run-dir", run_dir, "--", "true", timeout=30)
    err = second.stderr
    assert second.returncode == 2
    assert err.splitlines() == [f"diag: error: run dir {run_dir} is in use by another diag "
                                f"launch (pid {first.pid}); give another --run-dir"]
    assert driver_started(run_dir) and (run_dir / "launch.json").read_text() == launch_json
    assert first.poll() is None


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_run_with_one_line_and_the_stop_recorded(tmp_path, launches, sig):
    run_dir = tmp_path / "run"
    launcher = launches("launch", "--run-dir", str(run_dir), "--on-hang", "kill", "--", *STEPS)
    wait_for(lambda: driver_stepping(run_dir, 10), 60, what="10 steps of the driver")
    launcher.send_signal(sig)
    _, err = launcher.communicate(timeout=30)
    name = signal.Signals(sig).name
    assert launcher.returncode == 128 + sig
    assert f"diag: stopped by {name}: the command's processes were ended (the command then " \
           f"was ended by signal {signal.SIGTERM.value})" in err.splitlines()
    assert "Traceback" not in err
    ending = json.loads((run_dir / "exit.json").read_text())
    assert ending["stopped_by"] == name and ending["command_exit"] is None
    assert ending["exit_after_stop"] == -signal.SIGTERM
    report = json.loads((run_dir / "report.json").read_text())
    assert report["stopped_by"] == name and report["verdicts"] == []
    launched = json.loads((run_dir / "launch.json").read_text())
    assert (ending["schema_version"], report["schema_version"], launched["schema_version"]) == (
        2, 2, 1)
    assert not left_behind(run_dir)
    again = diag("analyze", run_dir)
    assert again.returncode == 0, again.stdout + again.stderr   # the stop is no death


def test_a_sigkilled_launcher_leaves_nothing_of_its_job_behind(tmp_path, launches):
    run_dir = tmp_path / "run"
    launcher = launches("launch", "--run-dir", str(run_dir), "--", "sh", "-c",
                        f"{' '.join(ENGINE_TP2)}; echo done")
    collector = Collector(str(run_dir))
    wait_for(lambda: driver_started(run_dir) and len(collector.snapshot().ranks) == 2,
               timeout=120, what="engine at tp=2")
    job = left_behind(run_dir)
    segments = {m.path for p in job for m in p.memory_maps() if m.path.startswith("/dev/shm/")}
    assert len(job) >= 4 and segments      # sh, the driver, two workers; their ring
    launcher.kill()
    killed_at = time.monotonic()
    wait_for(lambda: not left_behind(run_dir), timeout=15, what="end of the job")
    assert time.monotonic() - killed_at < 10
    assert not [segment for segment in segments if os.path.exists(segment)]
    again = diag("launch", "--run-dir", run_dir, "--", "true")   # the lock went with it
    assert again.returncode == 0
