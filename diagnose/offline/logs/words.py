"""The sentences: a finding or a link of a chain from one collapsed entry.

An exception reads as the issue asks, e.g.
    Worker_PP1_TP0 (rank 2, PP stage 1, TP 0): AssertionError at
    labprobe/__init__.py:224 execute_model: `assert False, (...)`: <its message>
"""
from __future__ import annotations

import re
import signal

from diagnose.offline.logs.model import Event, Finding, Kind, Severity
from diagnose.offline.logs.tracebacks import PyError

CUDA_ADVICE = ("CUDA kernels run asynchronously, so the line that reports the error may not "
               "be the one that caused it; rerun with CUDA_LAUNCH_BLOCKING=1 on that rank "
               "(diag launch --launch-blocking {rank})")
OOM_ADVICE = ("out of GPU memory: lower gpu_memory_utilization, max_num_seqs / "
              "max_num_batched_tokens or the context length, or add TP ranks")
LMCACHE_ADVICE = ("benign: vLLM's own prefix cache already holds more of the prompt than "
                  "LMCache hit, so LMCache has nothing to load")
REASON = re.compile(r"Connection (?:reset|closed) by peer|Broken pipe|"
                    r"Timed out waiting \d+ms for \w+ operation[^.]*")
SIGNALS = {int(number) for number in signal.Signals}
FIRST_ADVICE = "the first failure in the log: what follows it in the chain is its consequence"


def exception_text(error: PyError) -> str:
    """The exception and the innermost frame of the program's own code; an
    exception raised in hangscope's probe says so first: it is our bug."""
    ours = error.innermost is not None and error.innermost.hangscope()
    first = f"in hangscope's own code ({error.innermost.where()}): " if ours else ""
    if error.frame is None:
        return first + (f"{error.short}: {error.message}" if error.message else error.short)
    code = f": `{error.frame.code}`" if error.frame.code else ""
    message = f": {error.message}" if error.message else ""
    return f"{first}{error.short} at {error.frame.where()}{code}{message}"


def finding(entry, ctx, severity: Severity, kind: Kind | None = None,
            summary: str | None = None, advice: str = "") -> Finding:
    """A finding from a collapsed entry: its first event, its count, first and last time.
    ctx names processes (describe) and files (files)."""
    event: Event = entry.first
    who, rank = ctx.describe(event.proc)
    return Finding(kind=kind or event.kind, severity=severity,
                   summary=summary if summary is not None else f"{who}: {event.text}",
                   advice=advice, process=who, rank=rank,
                   path=ctx.files[event.file], line=event.line, text=event.text,
                   count=entry.count, first=event.stamp, last=entry.latest.stamp)


def root(entry, ctx) -> Finding:
    """A failure of its own: an exception, a CUDA error, an OOM, a dead rank."""
    event = entry.first
    who, rank = ctx.describe(event.proc)
    error = event.info.get("exception")
    said = exception_text(error) if isinstance(error, PyError) else None
    if event.kind == Kind.CUDA_ERROR:
        return finding(entry, ctx, Severity.FAILURE,
                       summary=f"{who}: {said or 'CUDA error: ' + event.info['cuda']}",
                       advice=CUDA_ADVICE.format(rank=rank if rank is not None else "RANK"))
    if event.kind == Kind.OUT_OF_MEMORY:
        return finding(entry, ctx, Severity.FAILURE,
                       summary=f"{who}: {said or 'out of GPU memory: ' + _oom(event.text)}",
                       advice=OOM_ADVICE)
    if event.kind == Kind.RANK_DIED:
        how = event.info["how"]
        cause = ("SIGKILL comes from the kernel's OOM killer or from outside the job: check dmesg"
                 if "SIGKILL" in how else "its own output above says why")
        made = finding(entry, ctx, Severity.FAILURE, summary=f"{event.info['who']} {how}",
                       advice=f"the engine stops with it; {cause}")
        made.process, made.rank = event.info["who"], event.info["rank"]
        return made
    if event.kind == Kind.WORKER_DIED:
        code, worker = event.info.get("code"), event.info["worker"]
        known = ctx.scan.procs.aliases.get((event.file, worker))
        name, rank = ctx.describe(known) if known is not None else (worker, None)
        if known is not None and not name.startswith(worker):
            name = f"{worker}, that is {name},"
        made = finding(entry, ctx, Severity.FAILURE,
                       summary=f"{name} died unexpectedly" + _exit(code),
                       advice="SIGKILL comes from the kernel's OOM killer or from outside the "
                              "job: check dmesg" if code == -9 else FIRST_ADVICE)
        made.process, made.rank = name, rank
        return made
    return finding(entry, ctx, Severity.FAILURE, summary=f"{who}: {said or event.text}",
                   advice=FIRST_ADVICE)


def link(entry, ctx, severity: Severity) -> Finding:
    """One consequence in a chain, in a few words."""
    event = entry.first
    who, _ = ctx.describe(event.proc)
    error = event.info.get("exception")
    said = exception_text(error) if isinstance(error, PyError) else event.text
    kind = event.kind
    if kind == Kind.ENGINE_CORE_FATAL:
        text = f"{who}: fatal error: {_short(_message(error) or said)}"
    elif kind == Kind.ENGINE_DEAD:
        text = f"{who}: {_message(error) or said}"
    elif kind == Kind.RPC_TIMEOUT:
        text = f"{who}: the RPC call to {event.info.get('method', 'execute_model')} timed out"
    elif kind == Kind.HTTP_ERROR:
        text = f"HTTP {event.info['status']} for {event.info['method']} {event.info['path']}"
    elif kind == Kind.WORKER_DIED:
        text = f"{event.info['worker']} died{_exit(event.info.get('code'))}"
    elif kind == Kind.BROADCAST_WAIT:
        text = (f"{who}: no free shared-memory broadcast block for {event.info['seconds']} s: "
                f"a worker stopped reading the broadcast")
    elif kind == Kind.JOB_STOPPED:
        text = _stopped(event, error)
    elif kind in (Kind.PEER_LOST, Kind.COLLECTIVE_TIMEOUT) and isinstance(error, PyError):
        reason = REASON.search(error.message)
        where = f" at {error.frame.where()}" if error.frame else ""
        text = f"{who}: {error.short}{where}: {reason.group(0) if reason else error.message}"
    elif kind == Kind.COLLECTIVE_TIMEOUT:
        text = (f"{who}: PyTorch's desync report: {event.info['desync'].replace('_', ' ')}"
                if event.info.get("desync") else f"{who}: NCCL's watchdog timed out")
    else:
        text = f"{who}: {said}"
    return finding(entry, ctx, severity, summary=text)


def _exit(code: int | None) -> str:
    if code is None:
        return ""
    if code < 0 and -code in SIGNALS:
        return f" (exit code {code}: {signal.Signals(-code).name})"
    return f" (exit code {code})"


def _stopped(event: Event, error) -> str:
    info = event.info
    if isinstance(error, PyError):
        return f"torchrun: {error.short}: it ended the job"
    if info.get("signal"):
        return f"torchrun sent {info['signal']} to the ranks still running"
    code = info.get("code")
    how = (f"was stopped by {signal.Signals(-code).name}" if code is not None and -code in SIGNALS
           else f"exited with code {code}")
    return f"torchrun: rank {info.get('rank')} {how}"


def _short(text: str, limit: int = 160) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _message(error) -> str | None:
    if not isinstance(error, PyError):
        return None
    return f"{error.short}: {error.message}" if error.message else error.short


def _oom(text: str) -> str:
    """PyTorch's OOM message up to the free memory; the rest is advice."""
    text = text.split("OutOfMemoryError: ", 1)[-1]
    end = text.find(" is free.")
    return text[:end + len(" is free.")] if end >= 0 else text[:160]
