"""--on-hang's actions as parsed, and the exec: hook run as a real process: its
arguments, its failure said in one note, a hook past its time ended, never an
exception in diag."""
import os
import sys
import time

import pytest

from diagnose.launch import escalate
from diagnose.launch.escalate import Hook, OnHang
from helpers.run import wait_for

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text,capture,kill_after_s,hook", [
    ("report", True, None, []),
    ("dump", True, None, []),
    ("kill", True, 0.0, []),
    ("dump,kill:5", True, 5.0, []),
    ("wait", False, None, []),
    ("kill:2.5,exec:notify --to 'on call',x", True, 2.5, ["notify", "--to", "on call,x"]),
])
def test_actions(text, capture, kill_after_s, hook):
    assert OnHang.parse(text) == OnHang(capture, kill_after_s, hook)


@pytest.mark.parametrize("text,says", [
    ("panic", "unknown action 'panic'"), ("kill:-1", "kill:SECONDS"),
    ("kill:1e9", "kill:SECONDS"),
    ("wait,dump", "wait only watches"), ("exec:", "needs a command"), ("exec:'", "exec:'"),
    ("killexec:x", "unknown action"), ("", "needs an action"),
])
def test_bad_actions(text, says):
    with pytest.raises(ValueError, match=says):
        OnHang.parse(text)


def test_the_hook_gets_the_reports_path_and_the_verdict(tmp_path):
    out = tmp_path / "out.txt"
    code = (f"import os, sys; open({str(out)!r}, 'w')"
            f".write(sys.argv[1] + '|' + os.environ['DIAG_VERDICT'])")
    hook = Hook([sys.executable, "-c", code], "run/report.json", "rank 3 hangs",
                str(tmp_path / "hook.log"))
    assert hook.finish() is None
    assert out.read_text() == os.path.abspath("run/report.json") + "|rank 3 hangs"


def test_a_failing_hook_is_one_note_with_its_output(tmp_path):
    hook = Hook([sys.executable, "-c", "print('pager down'); raise SystemExit(3)"], "r.json",
                "v", str(tmp_path / "hook.log"))
    note = hook.finish()
    assert note.startswith(f"--on-hang exec {sys.executable}: exited 3") and "pager down" in note


def test_a_missing_hook_is_one_note(tmp_path):
    hook = Hook(["/no/such/pager"], "r.json", "v", str(tmp_path / "hook.log"))
    assert hook.finish() == ("--on-hang exec /no/such/pager: cannot run '/no/such/pager': "
                             "No such file or directory")


def test_a_hook_past_its_time_is_ended(tmp_path, monkeypatch):
    monkeypatch.setattr(escalate, "HOOK_TIMEOUT_S", 0.5)
    began = time.monotonic()
    hook = Hook([sys.executable, "-c", "import time; time.sleep(60)"], "r.json", "v",
                str(tmp_path / "hook.log"))
    assert "still running after 0.5 s: ended" in hook.finish()
    assert time.monotonic() - began < 10 and hook.proc.poll() is not None


def test_the_kill_is_armed_once_and_falls_due_after_its_grace(tmp_path):
    escalation = escalate.Escalation("dump,kill:0.3", str(tmp_path))
    assert escalation.captured("r.json", "v") == 0.3 and not escalation.due()
    assert escalation.captured("r.json", "another hang") is None    # armed already
    wait_for(escalation.due, 5, what="the kill's grace to end")
    assert escalation.finish() == []
