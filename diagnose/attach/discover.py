"""The processes of a job we did not start, found from one pid: its ranks, with
their place in the TP x PP layout, the driver (vLLM's engine core, the engine's
process that spawned the workers) and the API server.

A rank is told from outside by what it shows of itself:
  - vLLM's process title, `VLLM::Worker_PP1_TP0` (0.32 sets it with
    setproctitle, into the command line and comm), or an older `VllmWorker-N`;
  - this project's engine's comm, `engine-rank-N` (diagnose/core/proc_names.py);
  - `RANK` and `WORLD_SIZE` in its environment, as torchrun sets them.
A child of a rank inherits what told its parent apart (a forked title, the
environment), so a rank is the outermost process that claims it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import psutil

from diagnose.core.layout import Layout
from diagnose.core.proc_names import ENGINE_RANK

VLLM_WORKER = re.compile(r"^VLLM::Worker((?:_[A-Z]+\d+)*)\b")
VLLM_OLD_WORKER = re.compile(r"^VllmWorker-(\d{1,6})\b")
VLLM_PART = re.compile(r"_([A-Z]+)(\d+)")
VLLM_ENGINE_CORE = re.compile(r"^VLLM::EngineCore\b")
VLLM_API_SERVER = re.compile(r"^VLLM::APIServer\b")
TP_FLAGS = ("-tp", "--tensor-parallel-size", "--tensor_parallel_size")
PP_FLAGS = ("-pp", "--pipeline-parallel-size", "--pipeline_parallel_size")
MAX_ENVIRON_BYTES = 1 << 20
MAX_TITLE = 200


class DiscoveryError(Exception):
    """The pid names no process, or nothing under it looks like a rank."""


@dataclass
class Place:
    """Where a process stands in the job, as it told us."""
    rank: int
    source: str                   # "vllm title", "engine name", "environment"
    tp_rank: int | None = None    # vLLM's title says these itself
    pp_rank: int | None = None
    world_size: int | None = None


@dataclass
class JobProcess:
    pid: int
    create_time: float
    uid: int
    title: str                    # its command line or title, cut to MAX_TITLE
    place: Place | None = None
    flags: tuple[int, int] | None = None   # (tp, pp) its whole command line gives


@dataclass
class Job:
    root: JobProcess
    kind: str                     # "vllm", "engine", "torchrun" (any RANK/WORLD_SIZE job)
    ranks: dict[int, JobProcess]
    layout: Layout | None         # None: ranks without a TP x PP layout (a torchrun job)
    world_size: int
    driver: JobProcess | None = None
    api_server: JobProcess | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def processes(self) -> dict[str, JobProcess]:
        """The processes to sample: 'R' for each rank, 'driver' for the driver."""
        named = {str(rank): proc for rank, proc in sorted(self.ranks.items())}
        if self.driver is not None:
            named["driver"] = self.driver
        return named


def find_job(pid: int) -> Job:
    try:
        root = psutil.Process(pid)
        tree = [root] + root.children(recursive=True)
    except psutil.NoSuchProcess:
        raise DiscoveryError(f"no process {pid}") from None
    except psutil.AccessDenied:
        raise DiscoveryError(f"cannot read process {pid}: permission denied") from None
    procs = {proc.pid: described for proc in tree if (described := describe(proc)) is not None}
    if pid not in procs:
        raise DiscoveryError(f"process {pid} ended while diag looked at it")
    parents = {proc.pid: _ppid(proc) for proc in tree}
    ranks = _outermost_ranks(procs, parents)
    if not ranks:
        raise DiscoveryError(
            f"no rank found under pid {pid} ({procs[pid].title[:60]}): give the pid of vllm "
            f"serve, a torchrun agent, python -m engine, or any parent of the ranks")
    job = _job(procs[pid], ranks, procs, parents)
    _check_complete(job)
    return job


def describe(proc: psutil.Process) -> JobProcess | None:
    """What diag knows of a process from outside; None for one that ended meanwhile."""
    try:
        with proc.oneshot():
            cmdline = proc.cmdline()
            comm, uid, created = proc.name(), proc.uids().real, proc.create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    except psutil.AccessDenied:
        cmdline, comm, uid, created = [], "", -1, 0.0
    title = " ".join(cmdline).strip() or comm
    described = JobProcess(proc.pid, created, uid, title[:MAX_TITLE], flags=command_flags(cmdline))
    described.place = _place(title, comm, proc.pid)
    return described


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.Error:
        return None


def _place(title: str, comm: str, pid: int) -> Place | None:
    told = place_from_name(title, comm)
    if told is not None:
        return told
    environ = read_environ(pid)
    if environ.get("RANK", "").isdigit() and environ.get("WORLD_SIZE", "").isdigit():
        return Place(int(environ["RANK"]), "environment",
                     world_size=int(environ["WORLD_SIZE"]))
    return None


def place_from_name(title: str, comm: str) -> Place | None:
    """A rank's place from its process title (vLLM) or comm (our engine); None
    for any other process. A vLLM title's rank is set once the layout is known."""
    for text in (title, comm):
        if found := VLLM_WORKER.match(text):
            parts = {name: int(value) for name, value in VLLM_PART.findall(found[1])}
            if not {"TP", "PP"} & set(parts) and found[1]:
                return None           # a DP-only or other title: not a layout we know
            return Place(-1, "vllm title", parts.get("TP", 0), parts.get("PP", 0))
        if found := VLLM_OLD_WORKER.match(text):
            return Place(int(found[1]), "vllm title")
    found = ENGINE_RANK.match(comm)
    return Place(int(found[1]), "engine name") if found else None


def read_environ(pid: int) -> dict[str, str]:
    """/proc/PID/environ as it was at exec, bounded; {} where it cannot be read."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as source:
            raw = source.read(MAX_ENVIRON_BYTES)
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {key.decode(errors="replace"): value.decode(errors="replace") for key, value in pairs}


def _outermost_ranks(procs: dict[int, JobProcess], parents: dict[int, int | None]
                     ) -> list[JobProcess]:
    """The processes that claim a place and have no ancestor claiming one the same
    way: the children of a rank (compile workers, data loaders) are no ranks."""
    return [proc for proc in procs.values() if proc.place is not None
            and _claiming_ancestor(proc, procs, parents) is None]


def _claiming_ancestor(proc: JobProcess, procs: dict[int, JobProcess],
                       parents: dict[int, int | None]) -> JobProcess | None:
    seen, pid = set(), parents.get(proc.pid)
    while pid is not None and pid in procs and pid not in seen:
        seen.add(pid)
        if procs[pid].place is not None and procs[pid].place.source == proc.place.source:
            return procs[pid]
        pid = parents.get(pid)
    return None


def _job(root: JobProcess, found: list[JobProcess], procs: dict[int, JobProcess],
         parents: dict[int, int | None]) -> Job:
    sources = {proc.place.source for proc in found}
    if len(sources) > 1:
        raise DiscoveryError(f"ranks of different kinds under pid {root.pid} "
                             f"({', '.join(sorted(sources))}): give the pid of one job")
    source = sources.pop()
    flags = layout_flags(procs.values())
    if source == "vllm title":
        return _vllm_job(root, found, procs, flags)
    ranks = _by_rank(found, root)
    if source == "engine name":
        layout = Layout(*flags) if flags else Layout(len(ranks), 1)
        driver = procs.get(parents.get(next(iter(ranks.values())).pid) or -1)
        return Job(root, "engine", ranks, layout, layout.world_size, driver=driver,
                   api_server=driver if driver and " serve" in driver.title else None)
    world = max(proc.place.world_size for proc in ranks.values())
    return Job(root, "torchrun", ranks, None, world)


def _vllm_job(root: JobProcess, found: list[JobProcess], procs: dict[int, JobProcess],
              flags: tuple[int, int] | None) -> Job:
    """Ranks by title: `Worker_PP1_TP0` gives the place (vLLM's rank is pp * tp_size
    + tp), an older `VllmWorker-N` the rank; the sizes from the flags, else from
    the highest places seen."""
    titled = [proc for proc in found if proc.place.tp_rank is not None]
    if flags:
        layout = Layout(*flags)
    elif titled:
        layout = Layout(max(proc.place.tp_rank for proc in titled) + 1,
                        max(proc.place.pp_rank for proc in titled) + 1)
    else:
        layout = Layout(len(found), 1)
    for proc in titled:
        proc.place.rank = layout.rank(proc.place.pp_rank, proc.place.tp_rank)
    ranks = _by_rank(found, root)
    engine_core = [proc for proc in procs.values() if VLLM_ENGINE_CORE.match(proc.title)]
    api = [proc for proc in procs.values() if VLLM_API_SERVER.match(proc.title)]
    serve = [proc for proc in procs.values() if re.search(r"\bvllm\b.*\bserve\b", proc.title)]
    return Job(root, "vllm", ranks, layout, layout.world_size,
               driver=engine_core[0] if engine_core else None,
               api_server=(api or serve or [None])[0])


def _by_rank(found: list[JobProcess], root: JobProcess) -> dict[int, JobProcess]:
    ranks: dict[int, JobProcess] = {}
    for proc in sorted(found, key=lambda proc: proc.create_time):
        other = ranks.setdefault(proc.place.rank, proc)
        if other is not proc:
            raise DiscoveryError(f"two processes under pid {root.pid} claim rank "
                                 f"{proc.place.rank} (pids {other.pid} and {proc.pid}): give "
                                 f"the pid of one job")
    return ranks


def layout_flags(procs) -> tuple[int, int] | None:
    """(tp, pp) from the first process whose command line gives either flag."""
    return next((proc.flags for proc in procs if proc.flags is not None), None)


def command_flags(words: list[str]) -> tuple[int, int] | None:
    """(tp, pp) as vLLM and python -m engine spell the flags, from a whole command
    line (a title is cut: a long model path pushed -pp out of it); None where it
    gives neither."""
    tp, pp = _flag(words, TP_FLAGS), _flag(words, PP_FLAGS)
    return None if tp is None and pp is None else (tp or 1, pp or 1)


def _flag(words: list[str], names: tuple[str, ...]) -> int | None:
    for index, word in enumerate(words):
        name, equals, value = word.partition("=")
        if name not in names:
            continue
        value = value if equals else (words[index + 1] if index + 1 < len(words) else "")
        if value.isdigit() and 0 < int(value) <= 1 << 16:
            return int(value)
    return None


def _check_complete(job: Job) -> None:
    missing = sorted(set(range(job.world_size)) - set(job.ranks))
    if missing:
        job.notes.append(f"{len(missing)} of {job.world_size} ranks not found under pid "
                         f"{job.root.pid} (ranks {', '.join(map(str, missing[:16]))}): "
                         f"another host's, or ended")
    extra = [rank for rank in job.ranks if rank >= job.world_size]
    if extra:
        raise DiscoveryError(f"rank {extra[0]} under pid {job.root.pid} is past the world "
                             f"size {job.world_size} the job's command line gives")
