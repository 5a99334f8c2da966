"""diag attach PID: find the job's processes, check that their stacks may be read,
sample them, judge the snapshot with the one analysis, write the run dir; with
kill, end the job once the report is written, and only then."""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field

import psutil

from diagnose.analysis import analyze
from diagnose.attach import ptrace
from diagnose.attach.discover import DiscoveryError, Job, find_job
from diagnose.attach.sample import Samples, sample
from diagnose.attach.states import job_snapshot
from diagnose.core.progress import bar, quiet
from diagnose.core.schema import Document, as_json, stamped
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.launch.leftovers import SharedMemoryTracker
from diagnose.offline import report

KILL_GRACE_S = 5.0


class AttachError(Exception):
    """Bad input or no permission: one line, exit 2."""


@dataclass
class AttachOptions:
    pid: int
    run_dir: str
    rounds: int = 4
    interval_s: float = 0.75
    native: bool = True


@dataclass
class Attached:
    job: Job
    samples: dict[str, Samples]
    snapshot: Snapshot
    verdicts: list[Verdict]
    took_s: float                  # from the call to the verdict
    notes: list[str] = field(default_factory=list)


def attach(opts: AttachOptions, progress: bool = True) -> Attached:
    """progress: a bar on stderr while it samples (not under the TUI)."""
    started = time.monotonic()
    if not ptrace.may_trace(opts.pid):   # its environment too: a rank may be told by it
        raise AttachError(ptrace.refusal(opts.pid, _uid(opts.pid)))
    try:
        job = find_job(opts.pid)
    except DiscoveryError as error:
        raise AttachError(str(error)) from None
    check_ptrace(job)
    samples = take_samples(job, opts, progress)
    notes = job.notes + [f"{name}: {note}" for name, s in samples.items() for note in s.notes]
    snapshot = job_snapshot(job, samples, opts.run_dir, time.time(), notes)
    verdicts = analyze(snapshot)
    return Attached(job, samples, snapshot, verdicts, time.monotonic() - started, notes)


def check_ptrace(job: Job) -> None:
    for name, proc in job.processes.items():
        if not ptrace.may_trace(proc.pid):
            raise AttachError(ptrace.refusal(proc.pid, proc.uid, _who(name)))


def take_samples(job: Job, opts: AttachOptions, progress: bool) -> dict[str, Samples]:
    pids = {name: proc.pid for name, proc in job.processes.items()}
    shown = bar(f"diag attach: sampling {len(pids)} processes of pid {job.root.pid}",
                opts.rounds * len(pids), "stacks")
    with shown if progress else nullcontext(quiet) as advance:
        samples = sample(pids, opts.rounds, opts.interval_s, opts.native, advance)
    for name, taken in samples.items():
        if taken.denied:
            proc = job.processes[name]
            raise AttachError(ptrace.refusal(proc.pid, proc.uid, _who(name)))
    return samples


def _uid(pid: int) -> int:
    try:
        return psutil.Process(pid).uids().real
    except psutil.Error:
        return -1


def _who(name: str) -> str:
    return "the driver" if name == "driver" else f"rank {name}"


def write_run_dir(attached: Attached, run_dir: str, again: bool = False) -> dict:
    """snapshot.json (what diag analyze and diag tui read back), attach.json (the
    job and every sample) and report.json; the report's body. again: replace
    what this diag attach wrote there before."""
    if not again:
        make_run_dir(run_dir)
    body = report_body(attached)
    files = {Document.SNAPSHOT: asdict(attached.snapshot),
             Document.ATTACH: job_body(attached), Document.REPORT: body}
    for document, content in files.items():
        with open(os.path.join(run_dir, document), "w") as sink:
            sink.write(as_json(stamped(document, content)))
    return body


def make_run_dir(run_dir: str) -> None:
    """A new directory, or an empty one: diag attach overwrites nothing."""
    try:
        os.makedirs(run_dir, exist_ok=True)
        if os.listdir(run_dir):
            raise AttachError(f"--run-dir {run_dir} is not empty: give a new directory")
    except OSError as error:
        raise AttachError(f"cannot use run dir {run_dir}: {error.strerror}") from None


def report_body(attached: Attached) -> dict:
    body = report.to_json(attached.snapshot, attached.verdicts)
    body["stacks"] = {name: s.last for name, s in attached.samples.items() if s.last}
    body["notes"] = attached.notes
    body["attach"] = {"pid": attached.job.root.pid, "kind": attached.job.kind,
                      "took_s": round(attached.took_s, 3), "moving": moving_ranks(attached)}
    return body


def moving_ranks(attached: Attached) -> list[int]:
    """The ranks whose stacks moved while diag looked: progress."""
    return sorted(int(name) for name, samples in attached.samples.items()
                  if name != "driver" and samples.moved())


def job_body(attached: Attached) -> dict:
    job = attached.job
    return {"pid": job.root.pid, "kind": job.kind, "world_size": job.world_size,
            "layout": asdict(job.layout) if job.layout else None,
            "processes": {name: asdict(proc) for name, proc in job.processes.items()},
            "api_server": asdict(job.api_server) if job.api_server else None,
            "samples": {name: asdict(s) for name, s in attached.samples.items()},
            "took_s": round(attached.took_s, 3)}


def end_job(pid: int, grace_s: float = KILL_GRACE_S) -> int:
    """SIGTERM to the process and everything under it, SIGKILL to what is left after
    the grace, then the /dev/shm files they held that no process holds any more,
    as diag launch does for a job it ends; how many processes there were."""
    try:
        root = psutil.Process(pid)
        procs = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        return 0
    shm = SharedMemoryTracker()
    shm.sample([proc.pid for proc in procs])
    for proc in procs:
        _quietly(proc.terminate)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        _quietly(proc.kill)
    psutil.wait_procs(alive, timeout=grace_s)
    shm.remove_leftovers()
    return len(procs)


def _quietly(call) -> None:
    try:
        call()
    except psutil.NoSuchProcess:
        pass
