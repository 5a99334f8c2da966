"""diag launch --tui in a real pseudo-terminal over the real engine (tp=2 pp=4,
rank 6 hangs before its first execute_model): the screen must show rank 6 as
the culprit; q, then s (stop the job) must end everything."""
import re
import sys
from pathlib import Path

import pexpect
import psutil

from helpers.terminal import Terminal

def test_tui_names_rank6_and_quits_cleanly(tmp_path):
    run_dir = str(tmp_path / "run")
    argv = [sys.executable, "-m", "diagnose.cli", "launch", "--tui", "--run-dir", run_dir,
            "--fault", "rank=6,at=execute_model,step=0,kind=hang", "--",
            sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
            "-pp", "4", "--prompt", "hello", "--max-tokens", "32"]
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "HOME": str(tmp_path)}
    terminal = Terminal(argv, env)
    try:
        terminal.wait_for(r"rank 6 \(pp 3/4, tp 0\) never reached execute_model", 180)
        terminal.wait_for(r"rank 6\s+CULPRIT", 10)
        terminal.child.send("q")
        terminal.wait_for(r"stop the job, or leave it running", 20)
        terminal.child.send("s")
        terminal.child.expect(pexpect.EOF, timeout=60)
    finally:
        terminal.child.close(force=True)
    left = [p for p in psutil.process_iter(["environ"])
            if (p.info["environ"] or {}).get("DIAG_RUN_DIR") == run_dir]
    assert not left


TWO_RANKS_SERVE = [sys.executable, str(Path(__file__).parent / "programs" / "two_ranks.py"), "serve"]
SERVING = r"serving two ranks on http://127\.0\.0\.1:8765"


def small_terminal(tmp_path, *options: str) -> tuple[Terminal, str]:
    run_dir = str(tmp_path / "run")
    argv = [sys.executable, "-m", "diagnose.cli", "launch", *options, "--run-dir", run_dir, "--",
            *TWO_RANKS_SERVE]
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "HOME": str(tmp_path)}
    return Terminal(argv, env), run_dir


def test_the_live_view_shows_the_command_output_as_it_comes(tmp_path):
    terminal, run_dir = small_terminal(tmp_path)
    try:
        terminal.wait_for(r"rank\s+┃", 30)          # the live view's rank table
        terminal.wait_for(SERVING, 5)               # and the output, above it
        terminal.child.sendintr()
        terminal.child.expect(pexpect.EOF, timeout=30)
    finally:
        terminal.child.close(force=True)
    assert terminal.child.exitstatus == 130


def test_the_tui_shows_the_output_and_leaves_the_server_address_on_the_terminal(tmp_path):
    terminal, run_dir = small_terminal(tmp_path, "--tui")
    try:
        terminal.wait_for(r"command output \(output\.log\)", 30)
        terminal.wait_for(SERVING, 5)
        terminal.wait_for(r"server at http://127\.0\.0\.1:8765", 5)
        terminal.child.send("q")
        terminal.wait_for(r"stop the job, or leave it running", 10)
        terminal.child.send("l")
        terminal.wait_for(r"diag: the command runs on; its server: http://127\.0\.0\.1:8765", 10)
        assert re.search(r"  \| " + SERVING, terminal.text())
        terminal.child.sendintr()
        terminal.child.expect(pexpect.EOF, timeout=30)
    finally:
        terminal.child.close(force=True)
    assert not [p for p in psutil.process_iter(["environ"])
                if (p.info["environ"] or {}).get("DIAG_RUN_DIR") == run_dir]
