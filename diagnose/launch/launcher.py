"""diag launch: run a command with the probe on in every rank, watch it, report.

The command runs in a session of its own, with DIAG_RUN_DIR (and the per-rank
toggles) in its environment, so every process it spawns publishes its state.
The launcher polls the run dir, runs the analysis, and on a hang dumps every
rank's stacks and writes the report. Its exit code is diag's own, never the
command's (that goes in the report): 0 healthy, 1 a verdict (a hang too, ended
or not), 4 a job that crashed with no hang (a rank died, or the command failed),
and 128 + N when signal N stopped the launcher (130 for the TUI's stop too).

The run dir is locked for the launcher's life (claim.py), and a guardian
process ends the job if the launcher dies without doing so (guardian.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING

import psutil

from diagnose.analysis.crash import crash_of
from diagnose.cli.common import EXIT_INTERRUPTED
from diagnose.core import schema
from diagnose.core.schema import Document
from diagnose.core.shown import shown
from diagnose.core.snapshot import Crash, Judged, Snapshot, Stop, Verdict
from diagnose.core.vocab import HANG_KINDS
from diagnose.launch import claim, first_failure, flight, judged_file
from diagnose.launch.collector import Collector, request_dump
from diagnose.launch.states import StateSampler
from diagnose.launch.dump import py_spy_all
from diagnose.launch.ending import command_ending, ending_line, judged_exit, verdict_key
from diagnose.launch.escalate import Escalation
from diagnose.launch.guardian import Guardian
from diagnose.launch.job import die_with_parent, end_job, job_processes, rank_pids, shell_code
from diagnose.launch.leftovers import SharedMemoryTracker
from diagnose.launch.options import LaunchOptions, command_env, options_json
from diagnose.launch.output import CommandOutput, to_stderr
from diagnose.launch.roles import role_of
from diagnose.launch.waiting import Waiting, phase_names
from diagnose.offline import report
from diagnose.probe import marks, rank_env

if TYPE_CHECKING:
    from diagnose.launch.metrics import Monitor

POLL_S = 0.25
STOP_GRACE_S = 10.0
ENDING_WAIT_S = 30.0    # a command whose main thread has exited, for its exit code
SHM_SAMPLE_S = 2.0      # how often the job's shared memory is noted
REPUBLISH_S = 10.0      # judged.json written again, unchanged, after this long


@dataclass
class Outcome:
    exit_code: int
    verdicts: list[Verdict]
    report_path: str


class LaunchError(Exception):
    """The command cannot be started: one line says why."""


class Launcher:
    def __init__(self, opts: LaunchOptions):
        self.opts = opts
        self.thresholds = opts.thresholds
        try:
            self.escalation = Escalation(opts.on_hang, opts.run_dir)
        except ValueError as error:
            raise LaunchError(f"--on-hang: {error}") from None
        self.monitor = _monitor(opts.metrics) if opts.metrics else None
        self.lock_fd = claim.claim(opts.run_dir)
        self.role = role_of(opts.thresholds, opts.listen, opts.head, opts.run_dir, opts.nnodes,
                            opts.node_rank)
        self.collector = Collector(opts.run_dir, hub=self.role.hub)
        self.states = StateSampler(opts.run_dir)   # what still ranks are doing (py-spy)
        self.output = CommandOutput(opts.run_dir, to_stderr if opts.echo_output else None)
        self.proc: subprocess.Popen | None = None
        self.guardian: Guardian | None = None
        self.waiting = Waiting(opts.marks, opts.run_dir)
        self.reported: set[tuple] = set()     # the hangs dumped and reported
        self.said: set[tuple] = set()         # the verdicts said in the output
        self.published: tuple | None = None   # the verdicts judged.json holds
        self.published_at = 0.0              # time.monotonic() of its last write
        self.echo_verdicts = False            # and on the terminal (no view shows them)
        self.judged: Judged | None = None     # the last poll's snapshot and verdicts, as one
        self.crash: Crash | None = None      # the first failure, once the job ended after it
        self.failure: first_failure.FirstFailure | None = None   # the one the report names
        self.notes: list[str] = []          # the report's notes, once it is written
        self.shm = SharedMemoryTracker()    # what the job holds in /dev/shm, to clean up after
        self.next_shm_sample = 0.0
        chosen = rank_env.parse_ranks(opts.launch_blocking) if opts.launch_blocking else None
        self.blocking: set[int] = set(chosen or ())
        self._stop, self._restart = threading.Event(), threading.Event()
        self.stop_code = EXIT_INTERRUPTED
        self.stopped_by: str | None = None   # why the launcher stopped the command, if it did

    # -- the command ------------------------------------------------------
    def start(self) -> None:
        try:
            self.proc = subprocess.Popen(self.opts.command, env=command_env(self.opts),
                                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_end_with_launcher)
        except OSError as error:
            raise LaunchError(f"cannot run {self.opts.command[0]!r}: {error.strerror}") from None
        self.guardian.watch(self.proc.pid)
        self.output.follow(self.proc.stdout)
        self.waiting = Waiting(self.opts.marks, self.opts.run_dir)
        self._write_json(Document.LAUNCH, {"command": self.opts.command, "pid": self.proc.pid,
                                           "started_at": time.time(), **options_json(self.opts)})

    def stop(self, ranks_first: bool = False) -> None:
        """End the command and every process of its job, gracefully first; with
        ranks_first, the ranks of this host before their parents."""
        if self.proc is None:
            return
        self.shm.sample([process.pid for process in self._job()])
        end_job(self.proc.pid, os.path.abspath(self.opts.run_dir), STOP_GRACE_S, self.proc,
                first=rank_pids(self.snapshot, self.proc.pid) if ranks_first else [])
        self.proc.wait()
        self.output.finish()
        self._remove_shared_memory()

    def _job(self) -> list[psutil.Process]:
        return job_processes(self.proc.pid, os.path.abspath(self.opts.run_dir))

    def _remove_shared_memory(self) -> None:
        removed = self.shm.remove_leftovers()
        if removed:
            note = (f"removed {len(removed)} shared-memory file(s) the job left in /dev/shm: "
                    f"{', '.join(removed)}")
            print(f"diag: {shown(note)}", file=sys.stderr)
            self.notes.append(note)
            if os.path.exists(self.report_path):
                self.add_to_report(notes=self.notes)

    def _ends_soon(self) -> bool:
        """Whether the command, whose main thread has exited, ends within
        ENDING_WAIT_S. Until its process is reaped its exit code is unknown, and
        its probe's process looks gone already: judged then, a clean exit would
        read as a death. Tearing down a CUDA context can take seconds."""
        try:
            exiting = psutil.Process(self.proc.pid).status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            exiting = False
        if not exiting:
            return False
        try:
            self.proc.wait(timeout=ENDING_WAIT_S)
        except subprocess.TimeoutExpired:
            return False
        return True

    # -- watching ---------------------------------------------------------
    def poll(self) -> list[Verdict]:
        began = time.monotonic()
        snapshot = self.collector.snapshot()
        snapshot.command_exit = self.proc.poll()
        if snapshot.command_exit is None:
            snapshot = self.states.seen(snapshot)
        for line in self.waiting.lines(snapshot):
            self.output.say(line)
        if time.monotonic() >= self.next_shm_sample:
            self.shm.sample([process.pid for process in self._job()])
            self.next_shm_sample = time.monotonic() + SHM_SAMPLE_S
        found = self.role.judge(snapshot)
        self.judged = Judged(found.judged or snapshot, tuple(found.verdicts))
        if found.stop is not None:
            self.request_stop(found.stop, by="head")
        self._say_new_verdicts()
        self._publish()
        if self.monitor is not None:
            self.monitor.publish(snapshot, self.verdicts, verdict_key, time.monotonic() - began)
        return self.verdicts

    def _say_new_verdicts(self) -> None:
        """Each verdict once, when it appears, in the output (and on the terminal
        where no view shows it): a hang's sentence says "for 3 s", then "for 4 s",
        but it is the same hang until its kind or culprit changes."""
        for verdict in self.verdicts:
            if verdict_key(verdict) not in self.said:
                self.said.add(verdict_key(verdict))
                self.output.say(f"{verdict.kind}: {verdict.summary}", echo=self.echo_verdicts)

    def _publish(self, last: bool = False) -> None:
        """judged.json (judged_file.py): when the verdicts change, else every
        REPUBLISH_S (its time says how fresh it is; 16,384 victims make 2 MB to
        write) and at the end; a write that fails (a full disk) leaves `diag tui`
        to judge for itself, as before."""
        held = tuple(verdict_key(verdict) for verdict in self.verdicts)
        now = time.monotonic()
        if not last and held == self.published and now - self.published_at < REPUBLISH_S:
            return
        self.published, self.published_at = held, now
        try:
            judged_file.write(self.opts.run_dir, self.judged.snapshot, self.verdicts)
        except OSError:
            pass

    def run(self, on_update=lambda launcher: None) -> Outcome:
        """Start the command and watch it until it ends, a hang ends it, or stop()."""
        self.guardian = Guardian(self.opts.run_dir, self.lock_fd)
        try:
            self.start()
            while self.proc.poll() is None:
                if self._restart.is_set():
                    self._restart_command()
                if self._stop.is_set():
                    return self._stopped()
                self.poll()
                on_update(self)
                outcome = self._on_hangs()
                if outcome is not None:
                    return outcome
                if self.escalation.due():
                    return self._end(judged_exit(self.verdicts, None), stopped_by="hang")
                time.sleep(POLL_S)
            # Judged with the exit code known, and by a fresh collector: the last
            # one takes a heartbeat that moved since its last look for a live process.
            self.collector = Collector(self.opts.run_dir, hub=self.role.hub)
            self.poll()
            self.crash = crash_of(self.snapshot)
            self.failure = self._first_failure()
            self.crash = first_failure.worded(self.crash, self.failure)
            on_update(self)
            self.write_report(dump=False)
            return self._end(judged_exit(self.verdicts, shell_code(self.proc.returncode),
                                         crashed=self.crash is not None))
        finally:
            self.states.close()
            self.stop()
            self._leave()
            self.guardian.release()
            self._finish_hooks()
            if self.monitor is not None:
                self.monitor.close()

    @property
    def snapshot(self) -> Snapshot | None:
        return self.judged.snapshot if self.judged else None

    @property
    def verdicts(self) -> list[Verdict]:
        return list(self.judged.verdicts) if self.judged else []

    def _leave(self) -> None:
        """The role's last word, on the last snapshot with the command's exit code."""
        last = None
        if self.judged is not None:
            last = replace(self.judged.snapshot, command_exit=self.proc.returncode)
        found = self.role.leave(last, STOP_GRACE_S, EXIT_INTERRUPTED)
        if found is not None:
            self.judged = Judged(last, tuple(found.verdicts))
            self._publish(last=True)

    def _on_hangs(self) -> Outcome | None:
        """Dumps and reports new hangs; the outcome once they end the run."""
        fresh = [v for v in self.verdicts
                 if v.kind in HANG_KINDS and verdict_key(v) not in self.reported]
        if not fresh or self._ends_soon():
            return None
        self.reported.update(map(verdict_key, fresh))
        if not self.escalation.on_hang.capture or not self.role.judges:
            return None
        self.write_report(dump=True)
        grace = self.escalation.captured(self.report_path, fresh[0].summary)
        if grace == 0:
            return self._end(judged_exit(self.verdicts, None), stopped_by="hang")
        if grace is not None:
            self.output.say(f"everything captured ({self.report_path}); ending the job in "
                            f"{grace:g} s (--on-hang {self.opts.on_hang})")
        return None

    def _finish_hooks(self) -> None:
        failures = self.escalation.finish()
        for failure in failures:
            print(f"diag: {failure}", file=sys.stderr)
        if failures and os.path.exists(self.report_path):
            self.notes += failures
            self.add_to_report(notes=self.notes)

    def _stopped(self) -> Outcome:
        """Stopped by a signal, the TUI or the head: the report is written (a hang's
        report, with its dumps, is kept), and the stop recorded."""
        if self.snapshot is None:
            self.poll()
        if not os.path.exists(self.report_path):
            self.write_report(dump=False)
        return self._end(self.stop_code, stopped_by=self.stopped_by)

    def _end(self, exit_code: int, stopped_by: str | None = None) -> Outcome:
        """exit.json says how the command ended: by itself, or stopped (and then
        which probed processes the stop ended: the analysis judges a stopped job
        as it stood then, not by the deaths the stop caused), and when it ended:
        a run dir read later is judged as of then."""
        if stopped_by:
            self.output.say(ending_line(stopped_by, self.verdicts, self.opts.on_hang),
                            echo=stopped_by == "hang")
        stop = self._stop_record() if stopped_by else None
        self.stopped_by = stopped_by
        self.role.end(exit_code, stopped=stopped_by is not None)
        self.stop(ranks_first=stopped_by == "hang")
        ended_at = time.time()
        self._name_first_failure()
        ending = command_ending(self.proc.returncode, stopped_by)
        self._write_json(Document.EXIT, ending | {
            "stop": None if stop is None else asdict(stop), "ended_at": ended_at})
        if stopped_by:
            self.add_to_report(**ending)
        return Outcome(exit_code, self.verdicts, self.report_path)

    def _first_failure(self) -> first_failure.FirstFailure | None:
        if not first_failure.wanted(self.snapshot, self.verdicts, self.crash):
            return None
        return first_failure.first_failure(self.opts.run_dir, self.snapshot)

    def _name_first_failure(self) -> None:
        """What killed the job, from the probes and its whole output once it is gone."""
        found = self.failure or self._first_failure()
        if found is not None:
            print(f"diag: {first_failure.line(found)}", file=sys.stderr)
            self.add_to_report(first_failure=asdict(found))

    def _stop_record(self) -> Stop:
        now = self.collector.snapshot()
        return Stop(at=now.taken_at, driver=bool(now.driver and now.driver.alive),
                    ranks=[rank for rank, state in now.ranks.items() if state.alive])

    # -- the TUI's controller, signals, and the head ----------------------
    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_stop(self, exit_code: int = EXIT_INTERRUPTED, by: str = "tui") -> None:
        if not self._stop.is_set():
            self.stop_code, self.stopped_by = exit_code, by
        self._stop.set()

    def toggle_launch_blocking(self, rank: int) -> bool:
        """CUDA_LAUNCH_BLOCKING for `rank` on the next restart; returns its new setting."""
        self.blocking ^= {rank}
        self.opts.launch_blocking = ",".join(map(str, sorted(self.blocking))) or None
        return rank in self.blocking

    def restart(self) -> None:
        self._restart.set()

    def _restart_command(self) -> None:
        self._restart.clear()
        self.stop()
        claim.clear_run_files(self.opts.run_dir)
        self.collector = Collector(self.opts.run_dir, hub=self.role.hub)
        self.reported.clear()
        self.said.clear()
        self.start()

    # -- dumps and the report -------------------------------------------
    @property
    def report_path(self) -> str:
        return os.path.join(self.opts.run_dir, Document.REPORT)

    def write_report(self, dump: bool) -> dict:
        """The verdicts of the last poll, with every rank's stacks when dump is set."""
        notes = self.collector.notes + self.role.notes + self.states.notes + marks.notes(
            self.opts.marks, self.opts.run_dir, phase_names(self.snapshot))
        body = report.to_json(self.snapshot, self.verdicts, crash=self.crash)
        body["stacks"], body["py_spy"] = self._stacks(self.snapshot), {}
        if dump:
            self.states.quiet()            # no sample pauses a rank while it is dumped
            asked, fr_notes = flight.ask_nccl_ranks(self.opts.run_dir)   # NCCL's take ~1 s
            notes += request_dump(self.opts.run_dir)   # stacks, and gloo's Flight Recorder
            notes += self.role.dump_other_nodes()
            dumped = self.collector.snapshot()  # holds the stacks files the ranks just wrote
            body["stacks"] = self._stacks(dumped)
            body["py_spy"], spy_notes = py_spy_all(dumped)
            notes += spy_notes + fr_notes + flight.wait_for_dumps(self.opts.run_dir, asked)[1]
            body["flight_recorder"] = {str(rank): os.path.relpath(path, self.opts.run_dir)
                                       for rank, path in flight.dumps_in(self.opts.run_dir).items()}
        body["notes"] = self.notes = notes
        body["command_exit"] = self.snapshot.command_exit
        self._write_report(body)
        return body

    def add_to_report(self, **sections) -> None:
        """More sections in the report already written."""
        with open(self.report_path) as f:
            body = schema.read_version(Document.REPORT, json.load(f))
        self._write_report(body | sections)

    def _write_report(self, body: dict) -> None:
        self._write_json(Document.REPORT, body)
        if self.opts.output:
            with open(self.opts.output, "w") as f:
                f.write(schema.as_json(schema.stamped(Document.REPORT, body)))

    @staticmethod
    def _stacks(snapshot: Snapshot) -> dict:
        return {str(rank): state.stacks for rank, state in snapshot.ranks.items() if state.stacks}

    def _write_json(self, document: Document, body: dict) -> None:
        with open(os.path.join(self.opts.run_dir, str(document)), "w") as f:
            f.write(schema.as_json(schema.stamped(document, body)))


def _monitor(address: tuple[str, int]) -> Monitor:
    from diagnose.launch.metrics import MonitorError, start_monitor
    try:
        return start_monitor(*address)
    except MonitorError as error:
        raise LaunchError(str(error)) from None


def _end_with_launcher() -> None:
    """In the child before exec: SIGTERM it if the launcher dies. It reaches this
    child only; the guardian ends the rest of the job."""
    die_with_parent(signal.SIGTERM)


