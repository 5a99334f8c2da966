"""Every row of every `diag COMMAND --help` exit-code table, checked against
what the command does; and each code has one meaning: `diag launch` never
exits with its command's own code (an unprobed command's 3 or 2 is no bug or
bad input of diag's), which is in the report and in one line."""
import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pexpect
import pytest

from diagnose import cli
from diagnose.launch import demo
from diagnose.launch.live import run_with_live_view
from helpers.run import DIAG, REPO, diag

pytestmark = pytest.mark.e2e

FIXTURES = os.path.join(REPO, "tests", "fixtures")
NO_FAULT = os.path.join(FIXTURES, "runs", "no_fault")
HUNG = os.path.join(FIXTURES, "runs", "rank6_never_reached")
ROW = re.compile(r"^  (\d+|128\+N)  ", re.MULTILINE)
# A probed rank that hangs in execute_model and, told to stop, exits 0.
HANGS_THEN_EXITS_0 = textwrap.dedent("""
    import signal, sys, time
    from diagnose import probe
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    probe.init("worker", rank=0, world_size=1, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    with probe.phase("execute_model", step=3):
        time.sleep(60)
""")


def subcommands() -> dict[str, argparse.ArgumentParser]:
    [commands] = [action for action in cli.build_parser()._actions
                  if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


def table(name: str) -> list[str]:
    text = subcommands()[name].format_help()
    return ROW.findall(text[text.index("\nexit codes:\n"):text.index("\nexamples:\n")])


def one_error_line(done: subprocess.CompletedProcess, says: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len([line for line in lines if line.startswith("diag: error: ")]) == 1, done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr


# Arguments each command accepts, for the checks that replace what it runs.
VALID = {"launch": ["--", "true"], "attach": ["1"], "analyze": [NO_FAULT], "dump": [NO_FAULT],
         "tui": [NO_FAULT],
         "logs": [os.path.join(FIXTURES, "logs", "vllm_tp2_healthy.log")],
         "synth": ["/tmp/never-written"], "demo": []}


def run_replaced(monkeypatch, name: str, error: BaseException) -> int:
    """cli.main on `name` with its work replaced by raising `error`."""
    def raises(args):
        raise error
    real = cli.build_parser

    def build():
        parser = real()
        [commands] = [action for action in parser._actions
                      if isinstance(action, argparse._SubParsersAction)]
        commands.choices[name].set_defaults(run=raises)
        return parser
    monkeypatch.setattr(cli, "build_parser", build)
    monkeypatch.delenv(cli.DEBUG_VAR, raising=False)
    return cli.main([name, *VALID[name]])


def bad_input(name):
    def check(tmp_path, monkeypatch, capsys):
        one_error_line(diag(name, "--no-such-flag", *VALID[name]), "unrecognized arguments")
    return check


def internal_error(name):
    def check(tmp_path, monkeypatch, capsys):
        assert run_replaced(monkeypatch, name, KeyError("a bug")) == 3
        assert capsys.readouterr().err.startswith("diag: internal error: KeyError")
    return check


def interrupted(name):
    def check(tmp_path, monkeypatch, capsys):
        assert run_replaced(monkeypatch, name, KeyboardInterrupt()) == 130
    return check


# -- diag launch ------------------------------------------------------------
def launch_healthy(tmp_path, monkeypatch, capsys):
    done = diag("launch", "--run-dir", tmp_path / "run", "--", "true")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "run" / "report.json").read_text())["command_exit"] == 0


def launch_hang_killed(tmp_path, monkeypatch, capsys):
    """A hang ended by --on-hang kill is a verdict (1); the command, which then
    exits 0 on SIGTERM, is not said to have exited 0 by itself."""
    run_dir = tmp_path / "run"
    done = diag("launch", "--run-dir", run_dir, "--on-hang", "kill", "--stall-timeout", "1",
                "--", sys.executable, "-c", HANGS_THEN_EXITS_0, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 1, done.stderr[-2000:]
    report = json.loads((run_dir / "report.json").read_text())
    assert [v["kind"] for v in report["verdicts"]] == ["stuck_in_phase"]
    ending = json.loads((run_dir / "exit.json").read_text())
    for body in (report, ending):
        assert (body["command_exit"], body["exit_after_stop"], body["stopped_by"]) == (
            None, 0, "hang")
    assert "diag: stopped by hang: the command's processes were ended (the command then " \
           "exited 0)" in done.stderr


def launch_crashed(tmp_path, monkeypatch, capsys):
    """An unprobed command's own 3 (or 2) must not read as diag's."""
    for code in (3, 2, 7):
        run_dir = tmp_path / f"run-{code}"
        done = diag("launch", "--run-dir", run_dir, "--", sys.executable, "-c",
                    f"import sys; sys.exit({code})")
        assert done.returncode == 4, done.stderr
        assert json.loads((run_dir / "report.json").read_text())["command_exit"] == code
        assert f"it exited {code} before any rank or driver started" in done.stderr
    done = diag("launch", "--run-dir", tmp_path / "killed", "--", sys.executable, "-c",
                "import os, signal; os.kill(os.getpid(), signal.SIGKILL)")
    assert done.returncode == 4 and "was ended by signal 9" in done.stderr


def launch_bad_input(tmp_path, monkeypatch, capsys):
    bad_input("launch")(tmp_path, monkeypatch, capsys)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.json").write_text("mine")
    one_error_line(diag("launch", "--run-dir", mine, "--", "true"), "did not write")


def launch_signalled(tmp_path, monkeypatch, capsys):
    for sig in (signal.SIGTERM, signal.SIGINT):
        run_dir = tmp_path / sig.name
        proc = subprocess.Popen([sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                                 str(run_dir), "--", "sleep", "30"], cwd=REPO,
                                stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while not (run_dir / "launch.json").exists():
            assert time.monotonic() < deadline, "the launch never started its command"
            time.sleep(0.1)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 128 + sig, err
    interrupted("launch")(tmp_path, monkeypatch, capsys)


# -- diag analyze -------------------------------------------------------------
def analyze_healthy(tmp_path, monkeypatch, capsys):
    assert cli.main(["analyze", NO_FAULT]) == 0


def analyze_verdict(tmp_path, monkeypatch, capsys):
    assert cli.main(["analyze", HUNG]) == 1


def analyze_bad_input(tmp_path, monkeypatch, capsys):
    bad_input("analyze")(tmp_path, monkeypatch, capsys)
    one_error_line(diag("analyze", tmp_path / "nothing"), "no such file or directory")
    run_dir = tmp_path / "run"
    shutil.copytree(NO_FAULT, run_dir)
    probe = sorted(run_dir.glob("rank-*.probe"))[0]
    probe.write_bytes(probe.read_bytes()[:40])    # a rank's file cut short
    done = diag("analyze", run_dir)
    one_error_line(done, "1 probe file(s) could not be read")
    assert probe.name in done.stderr and "rank" in done.stdout   # the rest is still shown


# -- the other commands --------------------------------------------------------
def dump_dumped(tmp_path, monkeypatch, capsys):
    shutil.copytree(NO_FAULT, tmp_path / "run")
    done = diag("dump", tmp_path / "run")
    assert done.returncode == 0, done.stderr


def tui_closed(tmp_path, monkeypatch, capsys):
    child = pexpect.spawn(DIAG[0], [*DIAG[1:], "tui", NO_FAULT], cwd=REPO,
                          dimensions=(40, 140), timeout=60, env=dict(os.environ, TERM="xterm"))
    child.expect("rank")
    child.send("q")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def logs_clean(tmp_path, monkeypatch, capsys):
    assert cli.main(["logs", os.path.join(FIXTURES, "logs", "vllm_tp2_healthy.log")]) == 0


def logs_findings(tmp_path, monkeypatch, capsys):
    assert cli.main(["logs", os.path.join(FIXTURES, "logs", "vllm_tp2_hang.log")]) == 1


def logs_bad_input(tmp_path, monkeypatch, capsys):
    bad_input("logs")(tmp_path, monkeypatch, capsys)
    done = diag("logs", tmp_path / "missing.log", os.path.join(FIXTURES, "logs",
                                                                "vllm_tp2_hang.log"))
    assert done.returncode == 2 and "missing.log" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout.strip()   # the other file is read


def synth_written(tmp_path, monkeypatch, capsys):
    assert cli.main(["synth", str(tmp_path / "big"), "--ranks", "8"]) == 0
    assert len(list((tmp_path / "big").glob("rank-*.probe"))) == 8


def demo_named(tmp_path, monkeypatch, capsys):
    done = diag("demo", "--no-tui", "--run-dir", tmp_path / "demo", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]


def demo_missed(tmp_path, monkeypatch, capsys):
    """A demo whose command runs no rank names no rank 6: it says it failed."""
    class NoRanks(demo.DemoJob):
        def command(self) -> list[str]:
            return [sys.executable, "-c", "pass"]
    monkeypatch.setattr(demo, "DEMO", NoRanks("tiny-llama", 2, 4))
    assert demo.run_demo(str(tmp_path / "demo"), run_with_live_view, tui=False) == 1


CHECKS = {("launch", "0"): launch_healthy, ("launch", "1"): launch_hang_killed,
          ("launch", "4"): launch_crashed, ("launch", "2"): launch_bad_input,
          ("launch", "128+N"): launch_signalled,
          ("analyze", "0"): analyze_healthy, ("analyze", "1"): analyze_verdict,
          ("analyze", "2"): analyze_bad_input,
          ("dump", "0"): dump_dumped, ("tui", "0"): tui_closed,
          ("logs", "0"): logs_clean, ("logs", "1"): logs_findings, ("logs", "2"): logs_bad_input,
          ("synth", "0"): synth_written, ("demo", "0"): demo_named, ("demo", "1"): demo_missed}
# Rows whose behaviour needs a real job that another test file starts already: the
# test named, which asserts the code, stands for the row.
ELSEWHERE = {("attach", "0"): ("test_attach", "test_healthy_job_at_work_is_no_hang_and_the_tui_"
                                              "keeps_sampling", "done.returncode == 0"),
             ("attach", "1"): ("test_attach", "test_engine_rank_blocked_before_execute_model",
                               "done.returncode == 1")}
for _name in VALID:
    CHECKS.setdefault((_name, "2"), bad_input(_name))
    CHECKS.setdefault((_name, "3"), internal_error(_name))
    CHECKS.setdefault((_name, "128+N"), interrupted(_name))


def test_every_row_of_every_table_is_checked_and_none_lists_a_code_twice():
    assert set(VALID) == set(subcommands())
    rows = [(name, code) for name in subcommands() for code in table(name)]
    assert len(rows) == len(set(rows)), rows
    assert not any(code == "130" for _, code in rows)     # 128+N says it
    assert set(rows) == set(CHECKS) | set(ELSEWHERE)
    for module, test, asserts in ELSEWHERE.values():
        assert asserts in source_of_test(module, test), (module, test)


def source_of_test(module: str, test: str) -> str:
    """The source of a test function in tests/MODULE.py, read, not imported: test
    files do not import one another."""
    path = os.path.join(REPO, "tests", module + ".py")
    with open(path) as f:
        text = f.read()
    [found] = [node for node in ast.walk(ast.parse(text))
               if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == test]
    return ast.get_source_segment(text, found)


@pytest.mark.parametrize("row", sorted(CHECKS), ids=lambda row: f"{row[0]}-{row[1]}")
def test_the_row_holds(row, tmp_path, monkeypatch, capsys):
    CHECKS[row](tmp_path, monkeypatch, capsys)
