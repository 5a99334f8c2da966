"""The data of diag logs: what one line told (Event), the process that printed
it (Proc), and what the reader is told (Finding).

The kinds are local to logs: no other room reads them, so they live here and
not in diagnose/core/vocab.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from diagnose.core.vocab import Name


class Kind(Name):
    # what can be a finding of its own
    EXCEPTION = "exception"                  # a Python exception, with its traceback
    CUDA_ERROR = "cuda_error"
    OUT_OF_MEMORY = "out_of_memory"
    RANK_DIED = "rank_died"                  # our engine: "rank 3 (pp 1/2, tp 1) was killed by ..."
    WORKER_DIED = "worker_died"              # vLLM: "Worker proc VllmWorker-0 died unexpectedly"
    EXECUTE_MODEL_HANG = "execute_model_hang"  # vLLM: a worker stopped returning from execute_model
    SLOW_BROADCAST = "slow_broadcast"        # the same warning, but requests finished after it
    COLLECTIVE_BEHIND = "collective_behind"  # NCCL / gloo: the rank the others wait for
    COLLECTIVE_STUCK = "collective_stuck"    # every rank joined, none finished
    LMCACHE_NEGATIVE_LOAD = "lmcache_negative_load"
    NCCL_WARNING = "nccl_warning"
    AFTER_SHUTDOWN = "after_shutdown"        # errors printed while a requested stop was under way
    DIAG_VERDICT = "diag_verdict"            # diag launch's own verdict line in the output
    # what follows a failure: the links of its chain
    ENGINE_CORE_FATAL = "engine_core_fatal"
    ENGINE_DEAD = "engine_dead"
    HTTP_ERROR = "http_error"
    RPC_TIMEOUT = "rpc_timeout"
    COLLECTIVE_TIMEOUT = "collective_timeout"
    PEER_LOST = "peer_lost"                  # connection reset or closed by a peer rank
    JOB_STOPPED = "job_stopped"              # the launcher (torchrun) ended the other ranks
    # what the story reads but never reports
    BROADCAST_WAIT = "broadcast_wait"
    PROGRESS = "progress"                    # a request finished (HTTP 2xx) or tokens came out
    READY = "ready"                          # the server started answering
    SHUTDOWN = "shutdown"                    # someone asked the job to stop
    DIAG_ENDED = "diag_ended"                # diag launch ended the job here


class Severity(Name):
    FAILURE = "failure"
    HANG = "hang"
    WARNING = "warning"
    NOTE = "note"            # worth knowing, not a fault: does not change the exit code


@dataclass
class Finding:
    kind: Kind
    severity: Severity
    summary: str                       # one line: who, what, where
    advice: str = ""                   # what it means, what to do, what the log cannot tell
    process: str = ""                  # "Worker_PP1_TP0 (rank 2, PP stage 1, TP 0)"
    rank: int | None = None
    path: str = ""
    line: int = 0
    text: str = ""                     # the log line it rests on, as printed (trimmed)
    count: int = 1                     # how many times the log says it
    first: str | None = None           # the first and last time, as the log prints them
    last: str | None = None
    chain: list[Finding] = field(default_factory=list)   # what followed from it, in order


@dataclass(eq=False)
class Proc:
    """One process of the job, as the log shows it. vLLM renames a worker while
    it starts (VllmWorker-3, Worker, Worker_PP1_TP1: one pid), so the best name
    seen so far wins."""
    key: tuple
    name: str | None = None            # "Worker_PP1_TP0", "EngineCore", "APIServer", "torchrun"
    pid: int | None = None
    rank: int | None = None            # a global rank the log states for it
    tp: int | None = None
    pp: int | None = None
    local_rank: int | None = None
    host: str | None = None

    def label(self) -> str:
        """The process without its pid when the name says who it is."""
        if self.name and (self.tp is not None or self.pp is not None
                          or self.name.startswith(("APIServer", "EngineCore"))):
            return self.name
        if self.rank is not None and not self.name:
            return f"rank {self.rank}"
        base = self.name or (f"{self.host}:{self.pid}" if self.host else "")
        return f"{base} pid={self.pid}" if self.pid is not None else base


@dataclass(eq=False)
class Event:
    kind: Kind
    file: int                          # the file's index in this run of diag logs
    line: int
    when: float | None                 # seconds into the year (the line's, or the last before)
    stamp: str | None                  # the line's own time as "MM-DD HH:MM:SS", if it has one
    proc: Proc
    text: str                          # the line as printed, trimmed
    info: dict = field(default_factory=dict)   # what the rule read off the line

    @property
    def order(self) -> tuple:
        return (self.when if self.when is not None else 0.0, self.file, self.line)
