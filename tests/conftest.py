"""Checks over the whole session, and the tiers every test belongs to.

Each test has exactly one tier (pyproject.toml lists them): the nearest of its own
marker, its file's `pytestmark`, or its file's row in FILE_TIERS. `pytest -m unit`
is the fast tier; a test in no tier fails collection, so a new file says where it
belongs."""
import os
import subprocess
import sys
import textwrap

import pytest

from helpers import vllm_serving
from helpers.run import REPO

RUNS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runs")
TIERS = ("unit", "e2e", "vllm", "gpu")

FILE_TIERS = {
    # no job started: in-process, or a short subprocess of diag on files
    **dict.fromkeys([
        "test_analysis.py", "test_bad_input.py", "test_block_manager.py", "test_engine_cli.py",
        "test_faults.py", "test_flight_recorder.py", "test_fr_peer_suite.py", "test_link.py",
        "test_loader.py", "test_model.py", "test_one_culprit.py", "test_progress.py",
        "test_sampler.py", "test_scheduler.py", "test_schema.py", "test_shm_ring.py",
        "test_sites.py", "test_tokenizer.py", "test_torch_debug.py", "test_tui_keys.py",
        "test_tui_states.py", "test_unseen_waits.py", "test_worker_replies.py",
    ], "unit"),
    # real processes: the engine, torchrun jobs, diag launch, the HTTP server
    **dict.fromkeys([
        "test_analyze_cli.py", "test_bench.py", "test_collector.py", "test_cuda_relaunch.py",
        "test_diag_cli.py", "test_diag_head_link.py", "test_dump.py", "test_engine.py",
        "test_fault_matrix.py", "test_fuzz_analyze.py", "test_generic.py",
        "test_gpu_stuck.py", "test_healthy_endings.py", "test_install.py", "test_kernels.py",
        "test_launch_lifecycle.py", "test_launch_output.py", "test_logs.py",
        "test_multinode.py", "test_multinode_diag.py", "test_probe.py", "test_server.py",
        "test_synth.py", "test_tui.py", "test_tui_e2e.py",
    ], "e2e"),
    "test_vllm.py": "vllm",
    **dict.fromkeys(["test_gpu.py", "test_gpu_diag.py"], "gpu"),
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier(item)
        if tier is None:
            raise pytest.UsageError(f"{item.nodeid} has no tier: mark it with one of {TIERS} "
                                    f"(tests/conftest.py)")
        item.add_marker(tier)


def _tier(item) -> str | None:
    """The nearest tier: the test's own marker, its file's pytestmark, FILE_TIERS. A
    file with a pytestmark tier holds tests of that tier only."""
    marks = getattr(item.module, "pytestmark", [])
    for names in ([mark.name for mark in item.own_markers],
                  [mark.name for mark in (marks if isinstance(marks, list) else [marks])]):
        tiers = [name for name in names if name in TIERS]
        if tiers:
            return tiers[0]
    return FILE_TIERS.get(os.path.basename(str(item.fspath)))


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory):
    """The tiny Llama checkpoint every real vLLM test serves."""
    return vllm_serving.make_checkpoint(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """One vLLM compile cache for the session, as a user's machine has one: each
    layout compiles cold once (minutes on 2 cores), then starts warm. The compile
    faults of tests/test_vllm_states.py compile a function of their own at run
    time, which no cache holds."""
    return tmp_path_factory.mktemp("vllm-cache")


_named_vllm: dict[str, str | None] = {}   # "reason": why that venv's vLLM does not import


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """A vLLM venv named by HANGSCOPE_VLLM_VENV (.ci/run's oldest release) is wanted:
    without a vLLM that imports there, each vLLM test fails with the reason."""
    if item.get_closest_marker("vllm") is None or not vllm_serving.VENV_NAMED:
        return
    if "reason" not in _named_vllm:
        _named_vllm["reason"] = vllm_serving.import_error("vllm", "hs_test_faults")
    if _named_vllm["reason"]:
        pytest.fail(f"{vllm_serving.VENV_VAR}: {_named_vllm['reason']}", pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def no_runs_dir_in_the_checkout():
    """diag launch's default run dir is runs/<time> in the working directory: a
    test that launches must give a --run-dir under its tmp_path instead."""
    existed = os.path.exists(RUNS)
    yield
    assert existed or not os.path.exists(RUNS), f"a test left {RUNS}: give it a --run-dir in tmp_path"


@pytest.fixture(autouse=True)
def vllm_servers_end_with_their_test():
    """A vLLM test that fails before it stops its server would leave vLLM serving
    on (seen: a TP x PP server at two cores' worth of CPU for the rest of a CI run,
    which then failed the vLLM tests after it for time): each one still running
    is ended here, as give_up ends one that never got ready."""
    yield
    running = [server for server in vllm_serving.STARTED if server.process.poll() is None]
    vllm_serving.STARTED.clear()
    for server in running:
        try:
            server.give_up(grace=15)
        except (AssertionError, OSError):
            pass


@pytest.fixture
def run_dir(tmp_path):
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def spawn(tmp_path, run_dir):
    """Starts `script` (dedented) as a process with the probe on; kills leftovers."""
    children = []

    def start(script: str, *args: str, env: dict | None = None) -> subprocess.Popen:
        path = tmp_path / f"child{len(children)}.py"
        path.write_text(textwrap.dedent(script))
        child_env = {**os.environ, "PYTHONPATH": str(REPO), "DIAG_RUN_DIR": str(run_dir),
                     **(env or {})}
        child = subprocess.Popen([sys.executable, str(path), *args], env=child_env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        children.append(child)
        return child

    yield start
    for child in children:
        if child.poll() is None:
            child.kill()
        child.communicate()
