"""`diag launch --mark` around a plain Python program: no torch.distributed, no
probe call of its own; the process is rank 0 of 1 once its mark is called. And
what diag says while it waits for a probe or a mark that has not fired."""
import os
import re
import sys

import pytest

from helpers.run import PROGRAMS, launch

pytestmark = pytest.mark.e2e

MARK = "plain_steps:Server.step"
DETECT_S = 5.0


def launch_marked(tmp_path, command, env=(), on_hang="kill"):
    """diag launch --mark MARK, with tests/programs importable by the command."""
    return launch(tmp_path, command, "--mark", MARK, on_hang=on_hang, timeout=90,
                  env={"PYTHONPATH": PROGRAMS, **dict(env)})


def test_mark_alone_names_the_stuck_function(tmp_path):
    done, body, run_dir = launch_marked(tmp_path, [sys.executable, os.path.join(PROGRAMS, "plain_server.py")],
                                 env={"PLAIN_STALL_AT": "3"})
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = body["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"], verdict["phase"], verdict["step"]) == (
        "stuck_in_phase", [0], "step", 3)
    assert verdict["detected_after_s"] < DETECT_S
    assert "plain_steps.py" in verdict["summary"] and verdict["summary"].endswith(" step")
    ended = [line for line in done.stderr.splitlines() if "diag ended the job here" in line]
    assert ended == ["diag: --- diag ended the job here (--on-hang kill: stuck_in_phase, "
                     "culprit rank 0) ---"]
    assert ended[0] in (run_dir / "output.log").read_text()


def test_plain_program_that_ends_is_healthy(tmp_path):
    done, body, run_dir = launch_marked(tmp_path, [sys.executable, os.path.join(PROGRAMS, "plain_server.py")],
                                 env={"PLAIN_STEPS": "20"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert body["verdicts"] == []
    assert sorted(name for name in os.listdir(run_dir) if name.endswith(".probe")) == ["rank-0.probe"]


def test_waiting_for_a_probe_and_for_a_mark_is_said_once(tmp_path):
    idle = "import plain_steps, time; time.sleep(13)"
    done, body, run_dir = launch_marked(tmp_path, [sys.executable, "-c", idle], on_hang="report")
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if line.startswith("diag: ")]
    waiting = [line for line in said if "has started the probe after" in line]
    assert len(waiting) == 1 and f"a first call of --mark {MARK}" in waiting[0]
    armed = [line for line in said if "not called yet" in line]
    assert len(armed) == 1 and re.fullmatch(
        rf"diag: --mark {re.escape(MARK)}=step: armed 1\d s ago, not called yet", armed[0])
    assert waiting[0] in (run_dir / "output.log").read_text()
