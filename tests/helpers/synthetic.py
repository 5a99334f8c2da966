"""The tests' hand-built snapshots of a TP x PP job: diagnose/synth.py's Job,
which plays the probe into a Snapshot (one implementation for tests,
benchmarks and `diag synth`), and the vLLM-like steps whose collectives run
inside its compiled model, out of the probe's sight."""
from diagnose.core.snapshot import RaisedError
from diagnose.core.vocab import Phase
from diagnose.offline.synth import OP_S, Job

__all__ = ["OP_S", "Job", "caught_exception", "compiled_step", "vllm_tp2"]


def compiled_step(job: Job, rank: int, step: int, start: float, end: float | None) -> None:
    """A vLLM-like step: the dequeue that takes its message, then execute_model;
    the all-reduces inside it are not seen."""
    job.dequeue(rank, start, start + OP_S)
    job.ranks[rank].ring_read += 1
    job.phase(job.ranks[rank], Phase.EXECUTE_MODEL, start + OP_S, end, step)


def vllm_tp2(steps: int, now_after: float) -> tuple[Job, float]:
    job = Job(tp=2, pp=1)
    t = job.everyone_started()
    for step in range(steps):
        job.driver_step(step, t, t + 0.1)
        for rank in (0, 1):
            compiled_step(job, rank, step, t, t + 0.09)
        t += 0.12
    job.now = t + now_after
    return job, t


def caught_exception(job: Job, t: float, rank: int, step: int, went_on: bool = False) -> None:
    """vLLM's worker: the step raised, the engine caught it, the rank waits for work
    (went_on: it took the next step, as a pipeline's next batch comes at once)."""
    state = job.ranks[rank]
    event = job.phase(state, Phase.EXECUTE_MODEL, t + OP_S, t + 0.05, step)
    assert event in state.phases
    state.ring_read += 1
    state.error = RaisedError(pid=state.identity.pid, at=t + 0.05, phase=Phase.EXECUTE_MODEL,
                              step=step, error="RuntimeError: injected by the plugin",
                              frame="tests/vllm_plugin.py:40 execute_model")
    if went_on:
        compiled_step(job, rank, step + 1, t + 0.06, None)
    else:
        job.dequeue(rank, t + 0.06)
