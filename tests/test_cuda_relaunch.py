"""--relaunch-on-cuda-error: which rank to run again with CUDA_LAUNCH_BLOCKING=1,
where the error reached each run's main thread, and the report of both runs
side by side, with a real job of two rank processes that plays a device-side
assert the way CUDA and NCCL show it."""
import json
import sys
import textwrap
from pathlib import Path

from rich.console import Console

from diagnose.offline import report
from diagnose.launch.cuda_relaunch import (cuda_error_rank, error_site, failed_kernel,
                                    relaunch_on_cuda_error)
from diagnose.launch.launcher import Launcher
from diagnose.launch.options import LaunchOptions
from diagnose.core.snapshot import WorkerExit
from helpers.synthetic import Job

REPO = Path(__file__).resolve().parents[1]

ASYNC_ERROR = """\
INFO step 3
Traceback (most recent call last):
  File "/repo/engine/worker.py", line 72, in busy_loop
    output = self.runner.execute_model(scheduler_output)
  File "/repo/engine/sampler.py", line 40, in sample
    return tokens.tolist()
RuntimeError: CUDA error: device-side assert triggered
"""
ASSERT_LINE = ("/repo/kernels/faults.py:31: _assert_kernel: block: [0,0,0], thread: [0,0,0] "
               "Assertion `diag fault: device_assert` failed.")


def dead_job(*exits):
    job = Job(tp=2, pp=1, now=100.0)
    job.everyone_started()
    for rank, exitcode, at in exits:
        job.died(rank, at, exitcode)
    return job.snapshot()


def test_the_first_rank_to_die_with_a_cuda_error_in_the_output_is_relaunched():
    snapshot = dead_job((0, -15, 60.0), (1, 1, 50.0))
    assert cuda_error_rank(ASYNC_ERROR, snapshot) == 1


def test_no_cuda_error_in_the_output_means_no_relaunch():
    snapshot = dead_job((1, 1, 50.0))
    assert cuda_error_rank("RuntimeError: out of memory\n", snapshot) is None


def test_a_cuda_error_without_a_dead_rank_means_no_relaunch():
    assert cuda_error_rank(ASYNC_ERROR, dead_job()) is None


def test_clean_exits_are_not_deaths():
    snapshot = dead_job((0, 0, 40.0), (1, 1, 50.0))
    snapshot.driver.worker_exits.append(WorkerExit(0, 0, 40.0))
    assert cuda_error_rank(ASYNC_ERROR, snapshot) == 1


def test_without_the_probes_files_the_site_comes_from_the_outputs_traceback(tmp_path):
    site = error_site(str(tmp_path), 1, "noise\n" + ASYNC_ERROR)
    assert site["error"] == "RuntimeError: CUDA error: device-side assert triggered"
    assert site["source"] == "output"
    assert (site["site"], site["code"]) == ("engine/sampler.py:40 sample", "return tokens.tolist()")
    assert site["frames"] == ["engine/worker.py:72 busy_loop", "engine/sampler.py:40 sample"]
    assert error_site(str(tmp_path), 1, "all fine\n") == {
        "error": None, "source": None, "site": None, "code": None, "frames": []}


def test_the_kernel_is_named_by_its_assert_line_else_by_the_launch_at_the_site():
    launch = {"code": "_rms_norm_kernel[(rows,)](x, weight, out)"}
    assert failed_kernel("noise\n" + ASSERT_LINE + "\n", launch) == "_assert_kernel"
    assert failed_kernel("noise\n", launch) == "_rms_norm_kernel"
    assert failed_kernel("noise\n", {"code": "return tokens.tolist()"}) is None
    torch_kernel = ("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1289: void at::native::"
                    "indexSelect<float>(int): block: [3,0,0], thread: [64,0,0] Assertion "
                    "`srcIndex < srcSelectDimSize` failed.")
    assert failed_kernel(torch_kernel, launch) == "void at::native::indexSelect<float>(int)"
    triton_line = ("kernels/faults.py:28: unknown: block: [0,0,0], thread: [32,0,0] Assertion "
                   "`diag fault: device_assert` failed")   # as Triton 3.6 printed it on an H200
    assert failed_kernel(triton_line, launch) == "_rms_norm_kernel"


# A stand-in for Triton, installed where packages live: its frames are not the
# program's, as a real kernel launch's are not.
FAKE_TRITON = """
    import os

    class Kernel:
        def __getitem__(self, grid):
            return self.launch

        def launch(self, *args):
            if os.environ.get("CUDA_LAUNCH_BLOCKING") == "1":
                print("/repo/kernels/faults.py:31: _assert_kernel: block: [0,0,0], "
                      "thread: [0,0,0] Assertion `diag fault` failed.", flush=True)
                raise RuntimeError("Triton Error [CUDA]: device-side assert triggered")
"""

# Rank 1 launches a kernel that fails. As on a GPU, the launch returns at once and
# NCCL's watchdog finds the error later and aborts the rank (SIGABRT) while its
# main thread waits in a later call; with CUDA_LAUNCH_BLOCKING=1 the launch raises,
# and the watchdog aborts the rank during the clean-up that follows.
FAKE_JOB = """
    import os, subprocess, sys, threading, time
    from diagnose import probe
    import fake_triton

    _assert_kernel = fake_triton.Kernel()

    def watchdog(after):
        time.sleep(after)
        print("[rank1]: Process group watchdog thread terminated with exception: "
              "CUDA error: device-side assert triggered", flush=True)
        os.abort()

    def forward(step):
        if rank == 1 and step == 2:
            _assert_kernel[(1,)](step)
            threading.Thread(target=watchdog, args=(0.3,)).start()

    def sample():
        time.sleep(60)

    def clean_up():
        threading.Thread(target=watchdog, args=(0.3,)).start()
        time.sleep(60)

    if len(sys.argv) == 1:
        children = [subprocess.Popen([sys.executable, __file__, str(rank)],
                                     env={**os.environ, "RANK": str(rank)}) for rank in (0, 1)]
        sys.exit(max(child.wait() for child in children))
    rank = int(sys.argv[1])
    probe.init("process", rank=rank, world_size=2)
    try:
        for step in range(3):
            with probe.phase("execute_model", step=step):
                with probe.phase("forward", step=step):
                    forward(step)
        with probe.phase("sample", step=2):
            sample()
    except RuntimeError:
        clean_up()
"""


def line_of(program: str, text: str) -> int:
    return next(number for number, line in enumerate(textwrap.dedent(program).splitlines(), 1)
                if text in line)


def test_both_runs_name_where_the_error_reached_the_rank_side_by_side(tmp_path, capsys):
    packages = tmp_path / "site-packages"
    packages.mkdir()
    (packages / "fake_triton.py").write_text(textwrap.dedent(FAKE_TRITON))
    program = tmp_path / "job.py"
    program.write_text(textwrap.dedent(FAKE_JOB))
    run_dir = tmp_path / "run"
    launcher = Launcher(LaunchOptions(command=[sys.executable, str(program)], run_dir=str(run_dir),
                                      on_hang="kill", echo_output=False))
    launcher.opts.command = ["env", f"PYTHONPATH={REPO}:{packages}", *launcher.opts.command]
    first = launcher.run()
    assert [(v.kind, v.culprit_ranks) for v in first.verdicts][:1] == [("dead", [1])]

    relaunch_on_cuda_error(launcher)

    body = json.loads((run_dir / "report.json").read_text())["cuda_error"]
    assert body["rank"] == 1 and body["kernel"] == "_assert_kernel"
    assert "Assertion `diag fault` failed" in body["device_assert"]
    surfaced, raised = body["first_run"], body["launch_blocking_run"]
    assert surfaced["source"] == "fatal signal"            # NCCL's watchdog aborted the rank
    sample_at = f"job.py:{line_of(FAKE_JOB, 'time.sleep(60)')} sample"
    launch_at = f"job.py:{line_of(FAKE_JOB, '_assert_kernel[(1,)](step)')} forward"
    assert surfaced["site"].endswith(sample_at), surfaced
    assert surfaced["error"].endswith("CUDA error: device-side assert triggered")
    assert raised["source"] == "exception"                 # the blocking launch raised
    assert raised["site"].endswith(launch_at), raised
    assert raised["code"] == "_assert_kernel[(1,)](step)"
    assert raised["error"] == "RuntimeError: Triton Error [CUDA]: device-side assert triggered"
    assert body["launch_blocking_report"] == str(run_dir / "blocking" / "report.json")

    console = Console(width=160, record=True)
    report.render_cuda_error(body, console)
    text = console.export_text()
    assert "CUDA error on rank 1: kernel _assert_kernel" in text
    assert "watchdog thread terminated" in text
    site_row = next(line for line in text.splitlines() if line.startswith(" call site"))
    assert site_row.index(sample_at) < site_row.index(launch_at)
    assert "CUDA error on rank 1" in capsys.readouterr().err   # the launcher printed it
