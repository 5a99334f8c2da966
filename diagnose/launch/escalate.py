"""What `diag launch --on-hang` does once a hang is named: capture (every rank's
stacks, Flight Recorder dumps, the report), run a hook, end the job after a grace
period; or only watch.

    report | dump        capture, keep the job running (the default; two names, one action)
    kill                 capture, then end the job at once
    kill:SECONDS         capture, then end the job SECONDS later (the metrics and
                         /health keep serving the hang meanwhile, so an alert can fire)
    exec:CMD             capture, then run CMD with the report's path as its last
                         argument (a pager or chat hook); it must be the last action,
                         since CMD runs to the end of the value
    wait                 only watch: no capture, no ending

Actions combine with commas: `dump,exec:notify-oncall --team llm,kill:30`.
"""
from __future__ import annotations

import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field

HOOK_TIMEOUT_S = 30.0      # a hook that runs longer is ended: it must never hold diag up
HOOK_OUTPUT_BYTES = 2000   # of a failed hook's output, kept for its note
KILL_MAX_S = 24 * 3600.0


@dataclass
class OnHang:
    capture: bool = True
    kill_after_s: float | None = None      # None: the job keeps running
    hook: list[str] = field(default_factory=list)

    @classmethod
    def parse(cls, text: str) -> OnHang:
        """ValueError with the reason for anything else than the actions above."""
        actions, hook = _split(text)
        if not actions and not hook:
            raise ValueError("needs an action: report, dump, kill[:SECONDS], "
                             "exec:CMD or wait")
        if "wait" in actions and (len(actions) > 1 or hook):
            raise ValueError("wait only watches: it does not combine with other "
                             "actions")
        on_hang = cls(capture="wait" not in actions, hook=hook)
        for action in actions:
            if action == "kill" or action.startswith("kill:"):
                on_hang.kill_after_s = _grace(action)
            elif action not in ("report", "dump", "wait"):
                raise ValueError(f"unknown action {action!r} (report, dump, "
                                 f"kill[:SECONDS], exec:CMD, wait)")
        return on_hang


def _split(text: str) -> tuple[list[str], list[str]]:
    """The actions before exec:, and exec's command (the rest of the value)."""
    head, found, command = text.partition("exec:")
    if found and head and not head.endswith(","):
        raise ValueError(f"unknown action {text.split(',')[0]!r}")
    actions = [action.strip() for action in head.split(",") if action.strip()]
    if not found:
        return actions, []
    try:
        hook = shlex.split(command)
    except ValueError as error:
        raise ValueError(f"exec:{command}: {error}") from None
    if not hook:
        raise ValueError("exec: needs a command, e.g. exec:notify-oncall")
    return actions, hook


def _grace(action: str) -> float:
    if action == "kill":
        return 0.0
    text = action.partition(":")[2]
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= KILL_MAX_S:
        raise ValueError(f"kill:SECONDS needs seconds from 0 to {KILL_MAX_S:g}, "
                         f"not {text!r}")
    return seconds


class Escalation:
    """The launcher's --on-hang over a run: after each new hang's capture, the hook
    started and the kill armed once; due() when the grace is over."""

    def __init__(self, text: str, run_dir: str):
        self.on_hang = OnHang.parse(text)
        self.run_dir = run_dir
        self.kill_at: float | None = None
        self.hooks: list[Hook] = []

    def captured(self, report_path: str, summary: str) -> float | None:
        """The grace before the end, when this capture arms the kill (0: end now)."""
        if self.on_hang.hook:
            log = os.path.join(self.run_dir, f"hook-{len(self.hooks)}.log")
            self.hooks.append(Hook(self.on_hang.hook, report_path, summary, log))
        if self.on_hang.kill_after_s is None or self.kill_at is not None:
            return None
        self.kill_at = time.monotonic() + self.on_hang.kill_after_s
        return self.on_hang.kill_after_s

    def due(self) -> bool:
        return self.kill_at is not None and time.monotonic() >= self.kill_at

    def finish(self) -> list[str]:
        """Waits for the hooks (each to its deadline): one line per failure."""
        return list(filter(None, (hook.finish() for hook in self.hooks)))


class Hook:
    """The exec: command, started with the report's path and left to run beside
    diag; finish() waits for it up to its deadline, ends it past that, and says
    how it went (None when it exited 0)."""

    def __init__(self, command: list[str], report_path: str, summary: str, log_path: str):
        self.command = command
        self.deadline = time.monotonic() + HOOK_TIMEOUT_S
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.failure: str | None = None
        env = dict(os.environ, DIAG_REPORT=os.path.abspath(report_path), DIAG_VERDICT=summary)
        try:
            with open(log_path, "wb") as log:
                self.proc = subprocess.Popen(command + [os.path.abspath(report_path)], env=env,
                                             stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as error:
            self.failure = f"cannot run {command[0]!r}: {error.strerror}"

    def finish(self) -> str | None:
        if self.proc is not None and self.failure is None:
            self.failure = self._wait()
        return None if self.failure is None else f"--on-hang exec {self.command[0]}: {self.failure}"

    def _wait(self) -> str | None:
        try:
            code = self.proc.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            return f"still running after {HOOK_TIMEOUT_S:g} s: ended"
        if code == 0:
            return None
        return f"exited {code}; its output: {_tail(self.log_path)!r}"


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, 9)
    except OSError:
        pass
    proc.wait()


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - HOOK_OUTPUT_BYTES))
            return f.read().decode(errors="replace").strip()
    except OSError:
        return ""
