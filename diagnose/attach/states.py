"""What diag attach found and sampled, as the Snapshot the analysis judges: one
RankState per rank (and the driver) with no probe records, only what was seen
from outside. Its stacks are the last dump (native frames where py-spy gave
them), `frame` the main thread's innermost Python frame, `activity` what the
last dump says it does (analysis.activity), `frame_moved_at` when the samples
last saw the main thread's frames change (the first sample's time where they
never did), and `started_at` that first sample's time: what diag knows of it
starts there (RankState.only_stacks; analysis/outside.py)."""
from __future__ import annotations

import socket

from diagnose.analysis.activity import CompileSeen, classify
from diagnose.attach.discover import Job, JobProcess
from diagnose.attach.sample import Samples
from diagnose.core.frames import is_native
from diagnose.core.snapshot import ActivitySample, Identity, RankState, Snapshot
from diagnose.core.vocab import Activity, Role
from diagnose.launch.collector import pid_alive


def job_snapshot(job: Job, samples: dict[str, Samples], run_dir: str, taken_at: float,
                 notes: list[str]) -> Snapshot:
    groups = job.layout.groups() if job.layout else {"world": list(range(job.world_size))}
    ranks = {rank: _state(job, proc, rank, samples[str(rank)], groups, taken_at)
             for rank, proc in sorted(job.ranks.items())}
    driver = None
    if job.driver is not None and "driver" in samples:
        driver = _state(job, job.driver, None, samples["driver"], groups, taken_at)
    return Snapshot(taken_at=taken_at, run_dir=run_dir, ranks=ranks, driver=driver,
                    notes=list(notes))


def _state(job: Job, proc: JobProcess, rank: int | None, samples: Samples,
           groups: dict[str, list[int]], taken_at: float) -> RankState:
    last = samples.last_sample
    frames = last.main_frames if last else []
    watched = samples.taken[0].at if samples.taken else taken_at
    return RankState(
        identity=_identity(job, proc, rank, groups), started_at=watched,
        heartbeat_at=taken_at, alive=pid_alive(proc.pid, proc.create_time), open_phases=[],
        frame=innermost_python(frames), phases=[], collectives=[],
        stacks=last.threads if last else None, frame_moved_at=samples.moved_at(),
        activity=activity_sample(proc.pid, samples, taken_at))


def activity_sample(pid: int, samples: Samples, taken_at: float) -> ActivitySample:
    """What the last dump says the main thread does; a compiler child at work over
    the samples makes it compiling whatever its stack says."""
    last = samples.last_sample
    if last is None:
        return ActivitySample(Activity.UNKNOWN, taken_at, pid,
                              note="; ".join(samples.notes) or "no stack", denied=samples.denied)
    found = classify(last.main_frames)
    sample = ActivitySample(found.activity, last.at, pid, frame=found.frame, rule=found.rule,
                            frames=last.main_frames, native=last.native,
                            note="; ".join(samples.notes) or None)
    if samples.compiler is not None:
        sample.activity, sample.rule, sample.frame = (Activity.COMPILING, "compile-child",
                                                      samples.compiler)
        sample.compiling_since = samples.taken[0].at
    elif found.activity == Activity.COMPILING:
        sample.compiling_since = _compiling_since(samples)
    sample.compiled_at = sample.taken_at if sample.activity == Activity.COMPILING else \
        _compiled_at(samples)
    return sample


def _compiled_at(samples: Samples) -> float | None:
    seen = CompileSeen()
    for taken in samples.taken:
        read = taken.threads is not None
        seen.add(classify(taken.main_frames).activity if read else Activity.UNKNOWN, taken.at,
                 samples.busy)
    return seen.at


def _compiling_since(samples: Samples) -> float:
    """The first of the dumps, up to the last, that all show a compile."""
    since = samples.taken[-1].at
    for taken in reversed([s for s in samples.taken if s.threads is not None]):
        if classify(taken.main_frames).activity != Activity.COMPILING:
            break
        since = taken.at
    return since


def _identity(job: Job, proc: JobProcess, rank: int | None,
              groups: dict[str, list[int]]) -> Identity:
    if rank is None:
        role = Role.DRIVER
    else:
        role = Role.WORKER if job.layout else Role.PROCESS
    pp_rank = tp_rank = tp_size = pp_size = None
    if rank is not None and job.layout is not None:
        pp_rank, tp_rank = job.layout.place(rank)
        tp_size, pp_size = job.layout.tp_size, job.layout.pp_size
    return Identity(role=role, rank=rank, world_size=job.world_size, tp_rank=tp_rank,
                    tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size,
                    host=socket.gethostname(), pid=proc.pid, device="", groups=groups)


def innermost_python(frames: list[str]) -> str:
    return next((frame for frame in reversed(frames) if not is_native(frame)), "")
