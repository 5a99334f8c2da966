"""The base install (`pip install hangscope`, no extras) is the debugger alone:
built from a copy of this checkout into a fresh venv without torch, where diag
analyze, logs, synth, launch and the TUI must work, as on a laptop that reads a
post-mortem or in a job's environment that must not be changed.

Slow (marked `slow`): one venv, a wheel build and a pip install of the
debugger's dependencies from the package index, some 20-40 s, once per module."""
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

from helpers.run import PROGRAMS, REPO, diag, free_port

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

FIXTURES = os.path.join(REPO, "tests", "fixtures")
BUILT_FROM = ["pyproject.toml", "README.md", "diagnose", "tui", "engine", "kernels"]
DEBUGGER_REQUIRES = {"prometheus_client", "psutil", "py-spy", "rich", "textual"}


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> str:
    """The bin/ of a fresh venv holding the base package and nothing else."""
    root = tmp_path_factory.mktemp("install")
    source = root / "src"
    source.mkdir()
    for name in BUILT_FROM:
        path = os.path.join(REPO, name)
        if os.path.isdir(path):
            shutil.copytree(path, source / name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
        else:
            shutil.copy(path, source / name)
    # setuptools of this environment builds the wheel when it has one: no download for it
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "wheel", "-q", "--no-deps", *isolation, "-w", str(root / "wheel"), str(source)])
    [wheel] = (root / "wheel").glob("hangscope-*.whl")
    run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")])
    # This pip installs into the venv (--python): the venv needs no pip of its own
    run([*pip, "--python", str(root / "venv" / "bin" / "python"), "install", "-q", str(wheel)])
    return str(root / "venv" / "bin")


def run(argv: list[str], timeout: float = 120, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=timeout,
                          **kwargs)
    assert done.returncode == 0, f"{argv[:4]}: {done.stderr[-2000:]}"
    return done


def clean_env(**extra: str) -> dict:
    """No PYTHONPATH: the venv must find diagnose and tui in its own site-packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return env | {"COLUMNS": "200", **extra}


def venv_diag(venv: str, *args: str, timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    """The venv's installed `diag` script, run from outside the checkout."""
    return diag(*args, program=(os.path.join(venv, "diag"),), timeout=timeout,
                cwd=os.path.dirname(venv), env=clean_env(**env))


def python(venv: str, code: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(venv, "python"), "-c", code, *args], check=False,
                          capture_output=True, text=True, timeout=60, cwd=os.path.dirname(venv), env=clean_env())


def test_base_requires_only_the_debugger_and_has_no_torch(venv):
    listed = python(venv, "import json; from importlib.metadata import requires; "
                          "print(json.dumps(requires('hangscope')))")
    requires = json.loads(listed.stdout)
    base = {re.match(r"[A-Za-z0-9._-]+", r).group() for r in requires if "extra ==" not in r}
    assert base == DEBUGGER_REQUIRES
    engine = {re.match(r"[A-Za-z0-9._-]+", r).group() for r in requires if 'extra == "engine"' in r}
    assert {"torch", "numpy", "aiohttp"} <= engine
    gpu = {re.match(r"[A-Za-z0-9._-]+", r).group() for r in requires if 'extra == "gpu"' in r}
    assert gpu == {"triton"}
    for module in ("torch", "numpy", "triton"):
        missing = python(venv, f"import {module}")
        assert missing.returncode == 1 and "ModuleNotFoundError" in missing.stderr, module


def test_help_and_bad_input(venv):
    helped = venv_diag(venv, "--help")
    assert helped.returncode == 0 and "analyze" in helped.stdout and "logs" in helped.stdout
    for argv, says in [(["tui", "/no/such/run"], "/no/such/run"),
                       (["demo", "--no-tui"], "pip install 'hangscope[engine]'")]:
        bad = venv_diag(venv, *argv)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and says in bad.stderr, argv


def test_analyze_recorded_and_synthetic_run_dirs(venv, tmp_path):
    recorded = venv_diag(venv, "analyze", os.path.join(FIXTURES, "runs", "rank6_never_reached"))
    assert recorded.returncode == 1, recorded.stderr
    assert "rank 6 (pp 3/4, tp 0) never reached execute_model" in recorded.stdout
    healthy = venv_diag(venv, "analyze", os.path.join(FIXTURES, "runs", "no_fault"))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr

    made = venv_diag(venv, "synth", str(tmp_path / "big"), "--ranks", "64", "--culprit", "10",
                "--fr-dumps")
    assert made.returncode == 0, made.stderr
    report = venv_diag(venv, "analyze", str(tmp_path / "big"), "--json")
    assert report.returncode == 1, report.stderr
    [verdict] = json.loads(report.stdout)["verdicts"]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("never_reached", [10])


def test_analyze_flight_recorder_dumps(venv, tmp_path):
    hung = venv_diag(venv, "analyze", os.path.join(FIXTURES, "fr_hang"))
    assert hung.returncode == 1, hung.stderr
    assert "rank 3 never joined tp1 all_reduce seq 5" in hung.stdout
    healthy = venv_diag(venv, "analyze", os.path.join(FIXTURES, "fr_healthy"))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr

    assert venv_diag(venv, "synth", str(tmp_path / "fr"), "--ranks", "16", "--culprit", "5",
                "--fr-dumps").returncode == 0
    report = venv_diag(venv, "analyze", str(tmp_path / "fr" / "fr"), "--json")
    assert report.returncode == 1, report.stderr
    assert json.loads(report.stdout)["verdicts"][0]["culprit_ranks"] == [5]


def test_logs(venv):
    crash = venv_diag(venv, "logs", os.path.join(FIXTURES, "logs", "vllm_tp2pp2_worker_assert.log"))
    assert crash.returncode == 1, crash.stderr
    assert "FIRST  Worker_PP1_TP0 (rank 2, PP stage 1, TP 0): AssertionError" in crash.stdout
    healthy = venv_diag(venv, "logs", os.path.join(FIXTURES, "logs", "vllm_tp2_healthy.log"))
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr


PILOT = textwrap.dedent("""
    import asyncio, sys
    from diagnose.launch.rundir import open_run
    from tui.app import DiagApp

    async def screen(path):
        app = DiagApp(open_run(path))
        async with app.run_test(size=(120, 40)) as pilot:
            while app.snapshot is None:
                await pilot.pause(0.02)
            await pilot.pause()
            return "\\n".join(strip.text for strip in app.screen._compositor.render_strips())

    for path in sys.argv[1:]:
        print(asyncio.run(screen(path)))
        print("--- end of screen")
""")


def test_tui_pilot_on_a_run_dir_and_on_flight_recorder_dumps(venv):
    shown = python(venv, PILOT, os.path.join(FIXTURES, "runs", "rank6_never_reached"),
                   os.path.join(FIXTURES, "fr_hang"))
    assert shown.returncode == 0, shown.stderr[-2000:]
    run_dir, dumps, _ = shown.stdout.split("--- end of screen\n")
    assert "rank 6 (pp 3/4, tp 0) never reached execute_model" in run_dir
    assert "▸rank 6  CULPRIT" in run_dir
    assert "rank 3 never joined tp1 all_reduce seq 5" in dumps


HANGS = textwrap.dedent("""
    import time
    from diagnose import probe
    probe.init("worker", rank=0, world_size=1, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1)
    with probe.phase("execute_model", step=3):
        time.sleep(60)
""")


def test_launch_a_job_without_torch(venv, tmp_path):
    """The probe and its bootstrap load in a job whose environment has no torch."""
    report = tmp_path / "report.json"
    done = venv_diag(venv, "launch", "--run-dir", str(tmp_path / "run"), "--on-hang", "kill",
                "--stall-timeout", "1", "-o", str(report), "--",
                os.path.join(venv, "python"), "-c", HANGS)
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    [verdict] = json.loads(report.read_text())["verdicts"]
    assert verdict["culprit_ranks"] == [0] and verdict["phase"] == "execute_model"


@pytest.mark.skipif(not importlib.util.find_spec("torch"), reason="the job needs torch")
def test_launch_a_torch_job_from_the_debugger_without_torch(venv, tmp_path):
    """diag from the torch-less venv; the job runs on this environment's torch."""
    report = tmp_path / "report.json"
    done = venv_diag(venv, "launch", "--run-dir", str(tmp_path / "run"), "--on-hang", "kill",
                "-o", str(report), "--",
                sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--monitor-interval", "0.5", "--master-port", str(free_port()),
                os.path.join(PROGRAMS, "dp_train.py"), timeout=90,
                TOY_FAULT="skip_allreduce:1:5")
    assert done.returncode == 1, done.stderr[-2000:]   # a verdict
    verdict = json.loads(report.read_text())["verdicts"][0]
    assert (verdict["kind"], verdict["culprit_ranks"]) == ("collective_missing_peers", [1])
