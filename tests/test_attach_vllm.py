"""diag attach on real vLLM (0.32, its CPU build) started without diag: tp=2 pp=2,
compiled as vLLM serves by default, serving one request after another. First,
healthy under that load: no hang. Then rank 2 falls asleep inside a
Worker.execute_model, put there by the tests' vLLM plugin (tests/vllm_env/faultplugin,
HS_TEST_FAULT) at the first call after the test creates a file: its peers wait
for it in the step's collectives, and attach names it alone."""
from __future__ import annotations

import json
import re
import signal
import threading
import time
from pathlib import Path

import psutil
import pytest

from helpers.vllm_serving import Server, serve_command, vllm_missing

from helpers.run import attach_until_verdict, free_port, timed_diag

pytestmark = [pytest.mark.vllm,
              pytest.mark.skipif(vllm_missing(), reason="real vLLM is not installed here: "
                                 "run ./setup.sh --tests (CI does)"),
              pytest.mark.timeout(1500)]

REPO = Path(__file__).resolve().parents[1]
FIRED = re.compile(r"hs_test_faults: rank 2 call (\d+): sleep$", re.M)
VERDICT_WITHIN_S = 15.0
READY_S = 900.0       # a cold compile of tp=2 pp=2 took over 420 s on 2 cores under load


def tree(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {root.pid, *(child.pid for child in root.children(recursive=True))}


def end(server: Server, pids: set[int]) -> None:
    """SIGINT to vllm serve, then SIGKILL to whatever of its processes is left:
    a worker asleep inside a step does not stop by itself."""
    if server.process.poll() is None:
        pids |= tree(server.process.pid)     # all of them, even before ready
        server.interrupt()
    _, alive = psutil.wait_procs([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)],
                                 timeout=30)
    for proc in alive:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    server.finish(timeout=60)


def test_vllm_tp2_pp2_healthy_then_rank_asleep_inside_execute_model(checkpoint, cache, tmp_path):
    port = free_port()
    go = tmp_path / "go"
    server = Server.start(serve_command(checkpoint, port, 2, 2), port,
                          cache, 4, tmp_path / "vllm.log",
                          tidy_shm=True, env={"HS_TEST_FAULT": f"rank=2,call=1,kind=sleep,after={go}"})
    pids: set[int] = set()
    stop = threading.Event()
    try:
        server.wait_ready(READY_S)
        server.keep_busy(stop, [])
        time.sleep(2.0)                     # requests in flight
        healthy, took = timed_diag("attach", server.process.pid, "--run-dir",
                                   tmp_path / "attach-healthy", "--json")
        print(f"\ndiag attach, vLLM tp2 pp2 healthy under load: {took:.1f} s")
        assert healthy.returncode == 0, healthy.stderr
        calm = json.loads(healthy.stdout)
        assert calm["verdicts"] == [] and calm["attach"]["moving"], calm["attach"]   # progressing
        go.touch()
        deadline = time.monotonic() + 300
        while not FIRED.search(server.log.read_text(errors="replace")):
            assert time.monotonic() < deadline, server.tail()
            time.sleep(0.5)
        call = FIRED.search(server.log.read_text(errors="replace")).group(1)
        time.sleep(2.0)                     # its peers go on into the step and wait there
        pids = tree(server.process.pid)
        done, took, tries = attach_until_verdict(server.process.pid, tmp_path)
        print(f"diag attach time to verdict: vLLM tp2 pp2, rank 2 asleep: {took:.1f} s "
              f"(attach {tries})")
        assert done.returncode == 1, done.stderr
        body = json.loads(done.stdout)
        assert [v["culprit_ranks"] for v in body["verdicts"]] == [[2]], body["verdicts"]
        assert "rank 2 (pp 1/2, tp 0)" in body["verdicts"][0]["summary"]
        assert took < VERDICT_WITHIN_S
        # untouched: every process still runs, rank 2 still asleep in the plugin
        assert all(running(pid) for pid in pids)
        assert f"rank 2 call {call}: sleep done" not in server.log.read_text(errors="replace")
    finally:
        stop.set()
        end(server, pids)
    assert not [pid for pid in pids if running(pid)]


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
