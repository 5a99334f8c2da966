"""What one line, or one rebuilt traceback, tells.

LINE_RULES are tried on every line that is not part of a traceback; each is a
set of substrings (cheap, and the prefilter the scanner runs on raw bytes)
and a function that reads the line and emits events or notes a fact of the
job. classify() names the kind of a finished Python exception.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from diagnose.offline.logs import diag_lines
from diagnose.offline.logs.model import Kind
from diagnose.offline.logs.tracebacks import PyError


@dataclass(frozen=True, eq=False)
class Rule:
    needles: tuple[str, ...]
    read: Callable          # (scanner, line, proc) -> None
    sampled: bool = False   # too common to read every one: only some are read (prefilter.py)


CUDA_ERROR = re.compile(r"CUDA error: ([^.;'\n]+)")
OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError")
TP_SIZE = re.compile(r"tensor_parallel_size['\"]?[=:] ?(\d+)")
PP_SIZE = re.compile(r"pipeline_parallel_size['\"]?[=:] ?(\d+)")
VLLM_RANK = re.compile(r"\bworld_size=(\d+) rank=(\d+)")
VLLM_PLACE = re.compile(r"\brank (\d+) in world size (\d+) is assigned as "
                        r".*?PP rank (\d+),.*?TP rank (\d+)")
BROADCAST = re.compile(r"No available shared memory broadcast block found in (\d+) second")
HTTP = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
THROUGHPUT = re.compile(r"generation throughput: ([\d.]+)")
LMCACHE = re.compile(r"need to load: (-\d+)")
ENGINE_RANK = re.compile(r"(?P<who>rank (?P<rank>\d+) \(pp \d+/\d+, tp \d+\)) "
                         r"(?P<how>was killed by signal \w+|exited with code -?\d+)")
ENGINE_HEADER = re.compile(r"^\[rank (\d+)\] worker failed:")
WORKER_DIED = re.compile(r"Worker proc (\S+) died unexpectedly(?:[^(]*\(exit code: (-?\d+)\))?")
NCCL_WARN = re.compile(r"NCCL WARN (.*)")
SIGTERM_SENT = re.compile(r"Sending process (\d+) closing signal (SIG\w+)")
SUMMARY_RANK = re.compile(r"^\s*rank\s*: (\d+) \(local_rank: (\d+)\)")
SUMMARY_EXIT = re.compile(r"^\s*exitcode\s*: (-?\d+) \(pid: (\d+)\)")
VARIABLE = re.compile(r"\b(VLLM_[A-Z_]+)\b")


def _cuda(scan, line, proc):
    found = CUDA_ERROR.search(line.body)
    if found and not OOM.search(line.body):
        scan.emit(Kind.CUDA_ERROR, line, proc, cuda=found.group(1).strip())


def _oom(scan, line, proc):
    if OOM.search(line.body):
        scan.emit(Kind.OUT_OF_MEMORY, line, proc)


def _sizes(scan, line, proc):
    tp, pp = TP_SIZE.search(line.body), PP_SIZE.search(line.body)
    if "non-default args" in line.body:
        scan.job.args(line.body)
    elif tp and "config" in line.body:
        scan.job.sizes(int(tp.group(1)), int(pp.group(1)) if pp else 1, "the engine's config line")


def _vllm_rank(scan, line, proc):
    found = VLLM_RANK.search(line.body)
    if found:
        scan.job.world_size = int(found.group(1))
        proc.rank = int(found.group(2))
        for rank in range(min(scan.job.world_size, 4096)):
            scan.job.saw_rank(rank)
    found = VLLM_PLACE.search(line.body)
    if found and proc.rank in (None, int(found.group(1))):
        proc.rank, proc.pp, proc.tp = int(found.group(1)), int(found.group(3)), int(found.group(4))


def _broadcast(scan, line, proc):
    found = BROADCAST.search(line.body)
    if found:
        scan.emit(Kind.BROADCAST_WAIT, line, proc, seconds=int(found.group(1)),
                  variable=_variable(line.body))


def _http(scan, line, proc):
    found = HTTP.search(line.body)
    if not found:
        return
    status = int(found["status"])
    if status >= 500:
        scan.emit(Kind.HTTP_ERROR, line, proc, status=status, method=found["method"],
                  path=found["path"])
    elif 200 <= status < 300 and found["method"] == "POST":
        scan.emit(Kind.PROGRESS, line, proc, what=f"{found['method']} {found['path']} {status}")


def _throughput(scan, line, proc):
    found = THROUGHPUT.search(line.body)
    if found and float(found.group(1)) > 0:
        scan.emit(Kind.PROGRESS, line, proc, what="tokens generated")


def _ready(scan, line, proc):
    scan.emit(Kind.READY, line, proc)


def _shutdown(scan, line, proc):
    if "received signal" in line.body or "shutdown triggered" in line.body:
        scan.emit(Kind.SHUTDOWN, line, proc)


def _lmcache(scan, line, proc):
    found = LMCACHE.search(line.body)
    if found:
        scan.emit(Kind.LMCACHE_NEGATIVE_LOAD, line, proc, tokens=int(found.group(1)))


def _engine_rank(scan, line, proc):
    found = ENGINE_RANK.search(line.body)
    if found:
        scan.job.saw_rank(int(found["rank"]))
        scan.emit(Kind.RANK_DIED, line, proc, who=found["who"], how=found["how"],
                  rank=int(found["rank"]))


def _engine_header(scan, line, proc):
    found = ENGINE_HEADER.match(line.body)
    if found:
        scan.owner(line, int(found.group(1)))


def _worker_died(scan, line, proc):
    found = WORKER_DIED.search(line.body)
    if found:
        scan.emit(Kind.WORKER_DIED, line, proc, worker=found.group(1),
                  code=int(found.group(2)) if found.group(2) else None)


def _nccl_warn(scan, line, proc):
    found = NCCL_WARN.search(line.body)
    if found:
        scan.emit(Kind.NCCL_WARNING, line, proc, message=found.group(1).strip())


def _torchrun(scan, line, proc):
    body = line.body
    if "Root Cause" in body:
        scan.torchrun_root_next = True
    found = SUMMARY_RANK.match(body)
    if found:
        scan.summary_rank = int(found.group(1))
        scan.job.saw_rank(scan.summary_rank)
        if scan.torchrun_root_next:
            scan.torchrun_root, scan.torchrun_root_next = scan.summary_rank, False
        return
    found = SUMMARY_EXIT.match(body)
    if found:
        scan.emit(Kind.JOB_STOPPED, line, proc, rank=scan.summary_rank, code=int(found.group(1)))
        return
    found = SIGTERM_SENT.search(body)
    if found:
        scan.emit(Kind.JOB_STOPPED, line, proc, signal=found.group(2))


LINE_RULES = (
    Rule(("CUDA error",), _cuda),
    Rule(("out of memory", "OutOfMemoryError"), _oom),
    Rule(("tensor_parallel_size", "non-default args"), _sizes),
    Rule(("world_size=", "is assigned as"), _vllm_rank),
    Rule(("shared memory broadcast block",), _broadcast),
    Rule(('HTTP/1.1" ', 'HTTP/1.0" ', 'HTTP/2" '), _http, sampled=True),
    Rule(("generation throughput:",), _throughput, sampled=True),
    Rule(("Application startup complete", "Starting vLLM server", "Starting vLLM API server"),
         _ready),
    Rule(("received signal", "shutdown triggered"), _shutdown),
    Rule(("need to load: -",), _lmcache),
    Rule(("was killed by signal", "exited with code"), _engine_rank),
    Rule(("worker failed:",), _engine_header),
    Rule(("died unexpectedly",), _worker_died),
    Rule(("NCCL WARN",), _nccl_warn),
    Rule(("Root Cause", "local_rank:", "exitcode", "closing signal"), _torchrun),
    Rule(("diag: ",), diag_lines.read),
)

# the lines the traceback assembler needs to see even when no rule asks for them
TRACEBACK_NEEDLES = ("Traceback (most recent call last)", "The above exception",
                     "During handling of the above exception")


def _variable(text: str) -> str | None:
    found = VARIABLE.search(text)
    return found.group(1) if found else None


def classify(error: PyError) -> tuple[Kind, dict]:
    """The kind of a finished exception: a failure of its own, or a link of a chain."""
    message, short = error.message, error.short
    info: dict = {"variable": _variable(message)}
    if short == "EngineDeadError":
        return Kind.ENGINE_DEAD, info
    if short == "ChildFailedError":
        return Kind.JOB_STOPPED, info
    rpc = re.search(r"RPC call to (\w+) timed out", message)
    if rpc:
        return Kind.RPC_TIMEOUT, {**info, "method": rpc.group(1)}
    if message.startswith("Worker failed with error"):      # vLLM's executor, in the engine core
        return Kind.ENGINE_CORE_FATAL, info
    if message.startswith("Engine core initialization failed"):
        return Kind.ENGINE_DEAD, info
    if "Watchdog caught collective operation timeout" in message or "Timed out waiting" in message:
        return Kind.COLLECTIVE_TIMEOUT, info
    if re.search(r"Connection (reset|closed) by peer|Broken pipe", message):
        return Kind.PEER_LOST, info
    if OOM.search(message) or short == "OutOfMemoryError":
        return Kind.OUT_OF_MEMORY, info
    if CUDA_ERROR.search(message):
        return Kind.CUDA_ERROR, {**info, "cuda": CUDA_ERROR.search(message).group(1).strip()}
    return Kind.EXCEPTION, info
