"""diag attach PID on real jobs started without diag: our engine at tp=2 pp=4 with
rank 6 blocked before its first execute_model, a torchrun gloo job whose rank 2
skips an all_reduce, a healthy torchrun job at work, and a diag without ptrace
rights over the job.

The engine's fault is the tests' own (tests/attach_faults/sitecustomize.py, on
PYTHONPATH): `--fault` needs diag's probe, which a job started without diag
does not run. The torchrun programs inject theirs (TOY_FAULT)."""
import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from diagnose.attach.live import AttachSource
from diagnose.attach.run import AttachOptions, attach, write_run_dir
from diagnose.launch.leftovers import SharedMemoryTracker
from diagnose.launch.py_spy import py_spy_dump
from helpers.run import (REPO, attach_until_verdict, diag_process, timed_diag, torchrun,
                         wait_for)
from tui.app import DiagApp

pytestmark = pytest.mark.e2e

FAULTS = os.path.join(REPO, "tests", "attach_faults")
VERDICT_WITHIN_S = 15.0
TIMES = {}          # case -> seconds from the call to the verdict, printed at the end


class Job:
    """A job started without diag, in a session of its own; ended by the test,
    with the shared memory its processes held (a killed engine leaves its ring)."""

    def __init__(self, command: list[str], log, **env):
        self.log = log
        self.shm = SharedMemoryTracker()
        self.proc = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, **env),
                                     stdout=log.open("w"), stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def processes(self) -> list[psutil.Process]:
        root = psutil.Process(self.proc.pid)
        return [root] + root.children(recursive=True)

    def wait_for_line(self, text: str, timeout: float) -> None:
        def said() -> bool:
            assert self.proc.poll() is None, self.log.read_text()[-2000:]
            return text in self.log.read_text()
        wait_for(said, timeout, what=repr(text), every=0.5)

    def end(self) -> None:
        """SIGTERM to its process group, then SIGKILL to every process of its tree
        still there: torchrun's workers run in sessions of their own, which a
        group signal misses if the agent dies first."""
        tree = []
        if self.proc.poll() is None:
            tree = self.processes()
            self.shm.sample([proc.pid for proc in tree])
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                pass
        _, left = psutil.wait_procs(tree, timeout=1)
        for proc in left:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(left, timeout=10)
        self.proc.wait(30)
        self.shm.remove_leftovers()


def diag_until(path, *args, timeout=120):
    """diag, and the seconds from its start until `path` exists (it is written
    before diag goes on: a --kill comes after the report)."""
    start, proc = time.monotonic(), diag_process(*args)
    wait_for(lambda: path.exists() or proc.poll() is not None, timeout, what=str(path))
    took = time.monotonic() - start
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def culprits(body: dict) -> list[list[int]]:
    return [verdict["culprit_ranks"] for verdict in body["verdicts"]]


def wait_for_frame(pid: int, frame: str, timeout: float) -> None:
    """Until py-spy shows `frame` in the process's stack: the fault has fired."""
    def shown() -> bool:
        stacks = py_spy_dump(pid).threads or {}
        return any(frame in label for frames in stacks.values() for label in frames)
    wait_for(shown, timeout, what=f"{frame} in pid {pid}'s stack", every=0.5)


def start_toy(tmp_path, fault: str, steps: int, step_s: float = 0.05) -> Job:
    """tests/programs/dp_train.py on 4 ranks under torchrun, without diag; each rank
    sleeps step_s after each step."""
    return Job(torchrun("dp_train.py", 4), tmp_path / "job.log", TOY_FAULT=fault,
               TOY_STEPS=str(steps), TOY_STEP_S=str(step_s))


def rank_pids(job: Job) -> dict[int, int]:
    ranks = {}
    for proc in job.processes():
        environ = proc.environ()
        if "RANK" in environ and "TORCHELASTIC_RUN_ID" in environ:
            ranks[int(environ["RANK"])] = proc.pid
    return ranks


def wait_for_ranks(job: Job, count: int, timeout: float) -> dict[int, int]:
    def all_up() -> dict[int, int] | None:
        assert job.proc.poll() is None, job.log.read_text()[-2000:]
        ranks = rank_pids(job)
        return ranks if len(ranks) >= count else None
    return wait_for(all_up, timeout, what=f"{count} ranks", every=0.5)


def test_engine_rank_blocked_before_execute_model(tmp_path):
    job = Job([sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
               "-pp", "4", "--prompt", "hi", "--max-tokens", "8"], tmp_path / "job.log",
              ATTACH_BLOCK_RANK="6", PYTHONPATH=f"{FAULTS}:{REPO}")
    try:
        job.wait_for_line("attach fault: rank 6 blocks before execute_model", timeout=240)
        time.sleep(2.0)                      # its peers go on into the step and wait there
        before = {proc.pid for proc in job.processes()}
        done, took, tries = attach_until_verdict(job.proc.pid, tmp_path)
        TIMES["engine tp2 pp4, rank 6 blocked"] = took
        assert done.returncode == 1, done.stderr
        body = json.loads(done.stdout)
        assert culprits(body) == [[6]], body["verdicts"]
        assert 7 in body["verdicts"][0]["victim_ranks"]
        assert took < VERDICT_WITHIN_S
        # read-only: every process still runs, and generate has not finished
        assert {proc.pid for proc in job.processes()} == before and job.proc.poll() is None
        again, _ = timed_diag("analyze", tmp_path / f"attach-{tries}", "--json")
        assert again.returncode == 1 and culprits(json.loads(again.stdout)) == [[6]]
    finally:
        job.end()


def test_torchrun_rank_skips_all_reduce_and_kill(tmp_path):
    job = start_toy(tmp_path, "skip_allreduce:2:3", steps=40)
    try:
        ranks = wait_for_ranks(job, 4, timeout=120)
        wait_for_frame(ranks[2], "toy_steps.py:40 train_step", timeout=120)
        run_dir = tmp_path / "attach"
        done, took = diag_until(run_dir / "report.json", "attach", str(job.proc.pid),
                                "--run-dir", str(run_dir), "--kill",
                                "-o", str(tmp_path / "report.json"))
        TIMES["torchrun gloo x4, rank 2 skips an all_reduce"] = took
        assert done.returncode == 1, done.stderr
        assert culprits(json.loads((tmp_path / "report.json").read_text())) == [[2]]
        assert "rank 2" in done.stdout and took < VERDICT_WITHIN_S
        # --kill: the report first, then the job ended
        assert (run_dir / "report.json").exists()
        assert job.proc.wait(30) is not None
        assert not any(psutil.pid_exists(pid) for pid in ranks.values())
    finally:
        job.end()


@pytest.mark.anyio
async def test_healthy_job_at_work_is_no_hang_and_the_tui_keeps_sampling(tmp_path):
    """A job at work: its ranks compute a tenth of the time or more. With the toy's
    default 50 ms sleep a step, a rank computes about 2% of the time, at the edge of
    what makes a sampled rank busy (launch.states.BUSY_SHARE); every sample of it
    then lands in the sleep while its peers wait in the all-reduce, which sampling
    cannot tell from a rank asleep for good (1 attach in 6 named it here)."""
    job = start_toy(tmp_path, "", steps=100000, step_s=0.005)
    try:
        ranks = wait_for_ranks(job, 4, timeout=120)
        wait_for_frame(ranks[3], "train_step", timeout=120)
        done, took = timed_diag("attach", str(job.proc.pid), "--run-dir", str(tmp_path / "attach"))
        TIMES["torchrun gloo x4, healthy"] = took
        assert done.returncode == 0, done.stdout + done.stderr
        assert "no hang: ranks progressing" in done.stdout
        assert job.proc.poll() is None
        await _tui_samples_again(job.proc.pid, tmp_path / "live")
    finally:
        job.end()


async def _tui_samples_again(pid: int, run_dir) -> None:
    """diag attach --tui's source: the TUI shows the ranks, and each poll samples
    the job again and rewrites the run dir."""
    opts = AttachOptions(pid, str(run_dir), rounds=2, interval_s=0.3, native=False)
    first = attach(opts, progress=False)
    write_run_dir(first, str(run_dir))
    app = DiagApp(AttachSource(opts, first))
    async with app.run_test(size=(120, 40)) as pilot:
        deadline = time.monotonic() + 60
        while (app.snapshot is None or app.snapshot.taken_at <= first.snapshot.taken_at) \
                and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert app.snapshot.taken_at > first.snapshot.taken_at and len(app.snapshot.ranks) == 4
        assert app.verdicts == [] and not app.read_error
    written = json.loads((run_dir / "snapshot.json").read_text())
    assert written["taken_at"] > first.snapshot.taken_at


SLEEPERS = """
import os, subprocess, sys, time
children = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                             env=dict(os.environ, RANK=str(rank), WORLD_SIZE="2"))
            for rank in range(2)]
print("started", flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("prefix", [("capsh", "--drop=cap_sys_ptrace", "--"),
                                    ("setpriv", "--reuid=65534", "--regid=65534",
                                     "--clear-groups")],
                         ids=["no-cap-sys-ptrace", "another-user"])
def test_no_ptrace_permission_is_one_line_and_exit_2(tmp_path, prefix):
    if os.getuid() != 0:
        pytest.skip("drops root's ptrace rights: run as root")
    job = Job([sys.executable, "-c", SLEEPERS], tmp_path / "job.log")
    try:
        job.wait_for_line("started", timeout=60)
        command = list(prefix) + (["-c", 'exec "$0" "$@"'] if prefix[0] == "capsh" else [])
        done, _ = timed_diag("attach", str(job.proc.pid), "--run-dir", str(tmp_path / "attach"),
                       prefix=command)
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "ptrace is not permitted" in lines[0]
        assert "SYS_PTRACE" in lines[0] and "ptrace_scope" in lines[0]
        assert not (tmp_path / "attach").exists()
        assert job.proc.poll() is None
    finally:
        job.end()


def teardown_module():
    for case, took in TIMES.items():
        print(f"\ndiag attach time to verdict: {case}: {took:.1f} s")
