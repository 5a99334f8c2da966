"""diag launch around real vLLM with faults from the tests' own vLLM plugin
(tests/vllm_env/faultplugin, set by HS_TEST_FAULT): faults inside the wrapped
Worker.execute_model, as a real hang, exception or compile inside a step would
be. For tests/test_vllm_states.py and benchmarks/vllm_states_stress.py."""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from helpers.vllm_serving import (READY_TIMEOUT_S, VENV_NAMED, VLLM, Server, import_error,
                                  launch_vllm)

# a cold compile of four ranks on a loaded 2-core machine; override with HS_VLLM_READY_S
READY_S = float(os.environ.get("HS_VLLM_READY_S", READY_TIMEOUT_S))
# vLLM's start-up profile run is one batch this size (4096 by default): a smaller one
# starts sooner, and a loaded CPU keeps it inside the analysis's start-up limit
BATCHED_TOKENS = ("--max-num-batched-tokens", "512")


def plugin_installed() -> bool:
    return VLLM.exists() and import_error("hs_test_faults") is None


def plugin_missing() -> bool:
    """Whether the tests that need the fault plugin skip: it is not installed, and no
    vLLM venv was asked for (HANGSCOPE_VLLM_VENV)."""
    return not VENV_NAMED and not plugin_installed()


@dataclass
class FaultRun:
    server: Server
    run_dir: Path
    texts: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start_requests(self) -> float:
        """Once the server is ready (the seconds it took), requests one after another."""
        ready_s = self.server.wait_ready(READY_S)
        self.server.keep_busy(self.stop, self.texts)
        return ready_s

    def serve_until_done(self) -> int:
        """Requests until the command ends: its exit code."""
        self.start_requests()
        try:
            return self.server.finish()
        finally:
            self.stop.set()

    def fired(self, line: str, timeout: float, pause=lambda: time.sleep(0.5)) -> float:
        """Waits for the plugin's line (e.g. "rank 1 call 3: compile done") in the
        log, calling `pause` between looks; the monotonic time it was seen."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if f"hs_test_faults: {line}" in self.server.log.read_text(errors="replace"):
                return time.monotonic()
            assert self.server.process.poll() is None, f"ended first:\n{self.server.tail()}"
            pause()
        raise AssertionError(f"{line!r} not in the log in {timeout:.0f} s:\n{self.server.tail()}")

    def serve_more_then_stop(self, more: int = 2, timeout: float = 120) -> tuple[int, int]:
        """After a fault: waits (up to timeout) for `more` requests to complete, then
        stops the requests and vLLM (SIGINT); (how many completed meanwhile, diag's
        exit code)."""
        served = len(self.texts)
        deadline = time.monotonic() + timeout
        while len(self.texts) < served + more and time.monotonic() < deadline:
            time.sleep(0.5)
        self.stop.set()
        time.sleep(2)
        self.server.interrupt(self.vllm_pid())
        code = self.server.finish()
        return len(self.texts) - served, code

    def stop_through_diag(self, more: int, timeout: float) -> tuple[int, int]:
        """As serve_more_then_stop, but stopped as a user's Ctrl-C stops it: SIGINT
        to diag launch, which ends the job itself (vLLM's own stop of a DP job
        SIGKILLs its engine cores: docs/architecture.md)."""
        served = len(self.texts)
        deadline = time.monotonic() + timeout
        while len(self.texts) < served + more and time.monotonic() < deadline:
            time.sleep(0.5)
        self.stop.set()
        self.server.interrupt()
        return len(self.texts) - served, self.server.finish()

    def report(self) -> dict:
        return json.loads((self.run_dir / "report.json").read_text())

    def vllm_pid(self) -> int:
        return json.loads((self.run_dir / "launch.json").read_text())["pid"]


def launch(work: Path, checkpoint: Path, cache: Path, fault: str, tp: int = 2, pp: int = 1,
           eager: bool = False, diag: tuple = ("--on-hang", "kill"), dp: int = 1) -> FaultRun:
    """`diag launch DIAG -- vllm serve` with HS_TEST_FAULT=fault, in `work`; DP
    ranks of tp x pp workers each with dp over 1."""
    extra = BATCHED_TOKENS + ("--enforce-eager",) * eager
    if dp > 1:
        extra += ("--data-parallel-size", str(dp))
    server, run_dir = launch_vllm(work, checkpoint, cache, tp, pp, diag, extra,
                                  env={"HS_TEST_FAULT": fault})
    return FaultRun(server, run_dir)


def culprits(report: dict) -> list[list[int]]:
    return [verdict["culprit_ranks"] for verdict in report["verdicts"]]


def show(case: str, report: dict) -> None:
    """Each verdict on one line, in the test's output."""
    for verdict in report["verdicts"]:
        print(f"{case}: {verdict['kind']} {verdict['culprit_ranks']} after "
              f"{verdict['detected_after_s']:.2f} s: {verdict['summary']}", file=sys.stderr)
