"""One hang of our engine at tp=2 pp=2 under `diag launch --metrics-port`, watched
from outside as monitoring would: /health polled every 0.1 s and, where the binary
is there, a real Prometheus scraping /metrics every second with the shipped alert
rules. tests/test_oncall.py checks it; benchmarks/metrics_plot.py plots it."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from diagnose.launch.collector import Collector
from helpers.prometheus_server import Prometheus, missing
from helpers.run import free_port

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENGINE = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
          "-pp", "2", "--prompt", "hi", "--max-tokens", "100000", "--ignore-eos"]
HOOK = """import os, sys
with open(sys.argv[1], "w") as f:
    f.write(sys.argv[2] + "\\n" + os.environ["DIAG_VERDICT"])
"""
RUN_TIMEOUT_S = 240


@dataclass
class Watched:
    run_dir: str
    hook_out: str
    fault_rank: int
    prometheus: Prometheus | None
    health: list[tuple[float, int, str]] = field(default_factory=list)
    firing: list[tuple[float, dict]] = field(default_factory=list)
    returncode: int | None = None
    stderr: str = ""
    started_at: float = 0.0
    exited_at: float = 0.0

    @property
    def fired_at(self) -> float:
        fault = Collector(self.run_dir).snapshot().ranks[self.fault_rank].fault
        assert fault is not None and fault.fired_at is not None, "the fault never fired"
        return fault.fired_at

    @property
    def first_503(self) -> float | None:
        return next((at for at, status, _ in self.health if status == 503), None)


def get_health(url: str) -> tuple[int, str] | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except OSError:
        return None


def watch(proc: subprocess.Popen, watched: Watched, port: int) -> None:
    """/health every 0.1 s, Prometheus' alerts every 0.5 s, until diag exits."""
    next_alerts = 0.0
    while proc.poll() is None:
        answer = get_health(f"http://127.0.0.1:{port}/health")
        if answer is not None:
            watched.health.append((time.time(), *answer))
        if watched.prometheus is not None and time.monotonic() >= next_alerts:
            next_alerts = time.monotonic() + 0.5
            watched.firing += [(time.time(), alert) for alert in watched.prometheus.firing()
                               if alert["labels"]["alertname"] == "HangscopeHang"]
        time.sleep(0.1)


def run_hung(workdir: str, fault_rank: int, fault_step: int, kill_after_s: float) -> Watched:
    """The run, to its end; the Prometheus (if any) is left running: stop() it."""
    port = free_port()
    prometheus = None if missing() else Prometheus(os.path.join(workdir, "prometheus"),
                                                   f"127.0.0.1:{port}")
    hook = os.path.join(workdir, "hook.py")
    with open(hook, "w") as f:
        f.write(HOOK)
    watched = Watched(os.path.join(workdir, "run"), os.path.join(workdir, "hook.txt"),
                      fault_rank, prometheus)
    hook_command = shlex.join([sys.executable, hook, watched.hook_out])
    watched.started_at = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", watched.run_dir,
         "--metrics-port", str(port), "--on-hang",
         f"dump,kill:{kill_after_s:g},exec:{hook_command}",
         "--fault", f"rank={fault_rank},at=execute_model,step={fault_step},kind=hang",
         "--", *ENGINE], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    watcher = threading.Thread(target=watch, args=(proc, watched, port))
    watcher.start()
    try:
        _, watched.stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        watched.exited_at = time.time()
        watched.returncode = proc.returncode
        watcher.join()
    return watched
