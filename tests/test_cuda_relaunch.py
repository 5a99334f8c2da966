"""--relaunch-on-cuda-error: which rank to run again with CUDA_LAUNCH_BLOCKING=1,
and the error site read from the output."""
from diagnose.launch import cuda_error_rank, error_site
from diagnose.snapshot import WorkerExit
from synthetic import Job

ASYNC_ERROR = """\
INFO step 3
Traceback (most recent call last):
  File "/repo/engine/worker.py", line 72, in busy_loop
    output = self.runner.execute_model(scheduler_output)
  File "/repo/engine/sampler.py", line 40, in sample
    return tokens.tolist()
RuntimeError: CUDA error: device-side assert triggered
"""


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


def test_error_site_is_the_error_line_and_the_frames_above_it():
    site = error_site("noise\n" + ASYNC_ERROR)
    assert site["error"] == "RuntimeError: CUDA error: device-side assert triggered"
    assert site["frames"] == ['File "/repo/engine/worker.py", line 72, in busy_loop',
                              'File "/repo/engine/sampler.py", line 40, in sample']
    assert error_site("all fine\n") == {"error": None, "frames": []}
