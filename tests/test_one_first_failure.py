"""One first failure per report: the probes' earliest record (each rank's first
exception, with its time; a death) joined with where the job's output printed
it, and the output alone where no probe recorded one. The shutdown that follows
a failure prints errors too, sometimes before the failure's own traceback: a
later error never replaces the first."""
from pathlib import Path

import pytest

from diagnose.analysis.crash import crash_of
from diagnose.core.snapshot import RaisedError
from diagnose.core.vocab import Phase
from diagnose.launch.first_failure import first_failure, line, worded
from helpers.synthetic import caught_exception, vllm_tp2

pytestmark = pytest.mark.unit

PREFIX = {0: "(Worker_TP0 pid=31) ERROR 12-03 12:46:06 [multiproc_executor.py:1063] ",
          1: "(Worker_TP1 pid=32) ERROR 12-03 12:46:06 [multiproc_executor.py:1063] "}
SHUTDOWN_FIRST = [
    (1, "Traceback (most recent call last):"),
    (1, '  File "/venv/vllm/v1/executor/multiproc_executor.py", line 1041, in worker_busy_loop'),
    (1, "    self._execute_worker_rpc(self.rpc_broadcast_mq.dequeue(indefinite=True))"),
    (1, "RuntimeError: cancelled"),
    (0, "Traceback (most recent call last):"),
    (0, '  File "/tests/vllm_plugin.py", line 40, in execute_model'),
    (0, '    raise RuntimeError("injected by the plugin")'),
    (0, "RuntimeError: injected by the plugin")]


def run_dir(tmp_path: Path, lines: list[tuple[int, str]]) -> str:
    (tmp_path / "output.log").write_text("".join(PREFIX[rank] + text + "\n"
                                                 for rank, text in lines))
    return str(tmp_path)


def raised_then_shut_down():
    """Rank 0 raises in step 3; a second later vLLM's shutdown cancels rank 1's dequeue."""
    job, t = vllm_tp2(steps=3, now_after=2.0)
    caught_exception(job, t, 0, 3)
    late = job.ranks[1]
    late.error = RaisedError(pid=late.identity.pid, at=t + 1.0, phase=Phase.DEQUEUE, step=4,
                             error="RuntimeError: cancelled", frame=None)
    job.command_exit = 0
    return job.snapshot()


def test_the_probes_first_exception_is_the_first_failure_though_the_shutdown_printed_first(
        tmp_path):
    snapshot = raised_then_shut_down()
    found = first_failure(run_dir(tmp_path, SHUTDOWN_FIRST), snapshot)
    assert (found.rank, found.source, found.line) == (0, "probe", 8)   # its traceback's line
    assert "raised RuntimeError: injected by the plugin in execute_model step 3" in found.summary
    assert found.process.startswith("Worker_TP0")
    crash = worded(crash_of(snapshot), found)
    assert (crash.rank, crash.summary) == (0, found.summary)          # the report's two agree
    assert "recorded by its probe, output line 8" in line(found)


def test_without_a_probe_record_the_output_names_the_first_failure(tmp_path):
    job, _ = vllm_tp2(steps=3, now_after=2.0)
    found = first_failure(run_dir(tmp_path, SHUTDOWN_FIRST[4:]), job.snapshot())
    assert (found.rank, found.source, found.at) == (0, "output", None)
    assert "RuntimeError" in found.summary and "injected by the plugin" in found.summary
    assert "from its output (line 4)" in line(found)


def test_a_probe_record_the_output_never_printed_is_named_alone(tmp_path):
    found = first_failure(run_dir(tmp_path, []), raised_then_shut_down())
    assert (found.rank, found.source, found.line, found.process) == (0, "probe", None, "")


def test_a_healthy_job_has_no_first_failure(tmp_path):
    job, _ = vllm_tp2(steps=3, now_after=0.05)
    assert first_failure(run_dir(tmp_path, []), job.snapshot()) is None
