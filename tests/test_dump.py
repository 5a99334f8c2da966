"""diag dump of a live rank: the probe's own stacks and py-spy's (with --native,
its native frames marked as such); a py-spy that cannot give native frames is
said to, with why."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from diagnose.launch import py_spy
from helpers.run import REPO, diag

NARROW = {"COLUMNS": "80"}
RANK = ("import time\nfrom diagnose import probe\n"
        "probe.init('worker', rank=0, world_size=1, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)\n"
        "with probe.phase('execute_model', step=3):\n"
        "    print('in', flush=True)\n"
        "    time.sleep(60)\n")


@pytest.fixture
def live_rank(tmp_path):
    rank = subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, stdout=subprocess.PIPE,
                            text=True, env=os.environ | {"DIAG_RUN_DIR": str(tmp_path)})
    try:
        assert rank.stdout.readline() == "in\n"
        yield tmp_path
    finally:
        rank.kill()
        rank.wait()
        rank.stdout.close()


def test_native_dump_shows_py_spys_native_frames_marked(live_rank):
    plain = diag("dump", live_rank, env=NARROW)
    native = diag("dump", live_rank, "--native", "-o", live_rank / "d.json", env=NARROW)
    assert plain.returncode == native.returncode == 0, plain.stderr + native.stderr
    assert "rank 0 (probe)" in plain.stdout and "[native]" not in plain.stdout
    assert "rank 0 (py-spy)" in plain.stdout      # both stacks, as the README says
    assert "rank 0 (probe)" in native.stdout and "rank 0 (py-spy --native)" in native.stdout
    assert any(line.strip(" │├└─").startswith("[native] ") for line in native.stdout.splitlines())
    body = json.loads((live_rank / "d.json").read_text())
    assert body["schema_version"] == 1 and body["native"] is True
    [frames] = [frames for frames in body["py_spy"]["0"].values()
                if "<string>:6 <module>" in frames]          # the main thread, in time.sleep
    assert frames[-1].startswith("[native] ")                # innermost: in C, sleeping


STUB = """#!/bin/sh
# A py-spy whose build cannot unwind native stacks (the real one here can).
case "$*" in *--native*) echo "Error: native stack traces are not supported" >&2; exit 1;; esac
echo '[{"thread_id": 7, "thread_name": "MainThread", "frames": [{"name": "main",
  "filename": "/app/serve.py", "module": null, "line": 3}]}]'
"""


def test_a_py_spy_without_native_frames_says_so_and_gives_pythons(tmp_path, monkeypatch):
    """A test double: the py-spy installed here does unwind native stacks."""
    stub = tmp_path / "py-spy"
    stub.write_text(textwrap.dedent(STUB))
    stub.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    stacks = py_spy.py_spy_dump(1234, native=True)
    assert stacks.threads == {"MainThread": ["app/serve.py:3 main"]}
    assert stacks.note == ("no native frames for pid 1234: py-spy dump of pid 1234 failed: "
                           "Error: native stack traces are not supported; Python frames only")


HOLDER = """import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
pid = int(sys.argv[1])
if libc.ptrace(16, pid, 0, 0) != 0:          # PTRACE_ATTACH: the target stops
    sys.exit(f"attach: errno {ctypes.get_errno()}")
os.waitpid(pid, 0)
print("held", flush=True)
time.sleep(float(sys.argv[2]))
libc.ptrace(17, pid, 0, 0)                    # PTRACE_DETACH
"""
# What py-spy 0.4 printed for a process another tracer held (above: RUST_BACKTRACE set).
SUSPEND_REFUSED = """Error: Failed to get stack traces

Caused by:
    0: Failed to suspend process
    1: EPERM: Operation not permitted
    2: EPERM: Operation not permitted

Stack backtrace:
   0: <E as anyhow::context::ext::StdError>::ext_context
   1: py_spy::python_spy::PythonSpy::get_stack_traces
   9: main
"""


def test_a_process_another_tracer_holds_is_dumped_once_it_lets_go():
    """A CI run: `diag dump` met the launcher's own py-spy pausing the rank, and
    reported ptrace refused. A real second tracer holds a process for a second."""
    target = subprocess.Popen([sys.executable, "-c", "import time\ntime.sleep(60)\n"])
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(target.pid), "1.0"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n", holder.wait(10)
        with open(f"/proc/{target.pid}/status") as status:
            assert f"TracerPid:\t{holder.pid}\n" in status.read()
        stacks = py_spy.py_spy_dump(target.pid)
        assert stacks.threads and stacks.note is None and not stacks.denied, stacks.note
    finally:
        for process in (holder, target):
            process.kill()
            process.wait()


def test_py_spys_error_is_said_by_its_first_line_and_innermost_cause():
    note = py_spy._failure_note(7, SUSPEND_REFUSED)
    assert note.startswith("py-spy may not read pid 7: Error: Failed to get stack traces "
                           "(EPERM: Operation not permitted) (run as root")
    assert py_spy._failure_note(7, "") == "py-spy dump of pid 7 failed: no message"
