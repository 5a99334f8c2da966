"""The TUI's first screen in a real 80x24 pseudo-terminal, over `diag launch
--tui` around a plain Python program watched through its --mark: once diag
names the culprit, its rank, phase and stuck frame are on the screen within a
second, without a key press."""
import os
import re
import sys
import time

import pexpect
import pytest

from helpers.run import left_behind
from helpers.terminal import Terminal

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROGRAMS = os.path.join(REPO, "tests", "programs")
VERDICT_LINE = "diag: stuck_in_phase: rank 0 stuck in step at step 3"
ON_SCREEN_S = 1.0


def verdict_seen_at(output_log: str) -> float | None:
    """When the launcher wrote its verdict line into output.log (its mtime then)."""
    try:
        with open(output_log) as log:
            if VERDICT_LINE in log.read():
                return os.stat(output_log).st_mtime
    except FileNotFoundError:
        pass
    return None


def test_culprit_rank_phase_and_frame_show_at_80x24_without_a_key(tmp_path):
    run_dir = str(tmp_path / "run")
    argv = [sys.executable, "-m", "diagnose.cli", "launch", "--tui", "--run-dir", run_dir,
            "--mark", "plain_steps:Server.step", "--", sys.executable,
            os.path.join(PROGRAMS, "plain_server.py")]
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "HOME": str(tmp_path),
           "PYTHONPATH": os.pathsep.join([REPO, PROGRAMS]), "PLAIN_STALL_AT": "3"}
    terminal = Terminal(argv, env, columns=80, lines=24)
    try:
        culprit = (r"rank 0  CULPRIT", r"step · step 3", r"plain_steps\.py:\d+ step")
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            terminal.read(0.05)
            if all(re.search(pattern, terminal.text()) for pattern in culprit):
                break
        else:
            raise AssertionError(f"the culprit is not on screen:\n{terminal.text()}")
        shown_at = time.time()
        said_at = verdict_seen_at(os.path.join(run_dir, "output.log"))
        assert said_at is not None, terminal.text()
        assert shown_at - said_at < ON_SCREEN_S, terminal.text()
        terminal.child.send("q")
        terminal.wait_for(r"stop the job, or leave it running", 20)
        terminal.child.send("s")
        terminal.child.expect(pexpect.EOF, timeout=60)
    finally:
        terminal.child.close(force=True)
    assert not left_behind(tmp_path / "run")
