"""The TUI driven through Textual's Pilot: over synthetic snapshots of a tp=2 pp=4
run (rank 6 stuck before execute_model, and no fault) with the real analysis,
over a run dir of live probed processes, and as screen snapshots."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from textual.widgets import Static

from diagnose.analysis import analyze
from diagnose.core.snapshot import Snapshot, Verdict
from helpers.run import diag
from helpers.synthetic import Job
from helpers.tui_synthetic import (PP, SIZE, TP, RecordingController, SyntheticSource, no_fault, offered,
                                   rank6_never_reached, screen_text, settle, started, until)
from diagnose.launch import judged_file
from diagnose.launch.rundir import RunDirSource, open_run as open_run_dir
import tui.app as tui_app
from tui.app import POLL_INTERVAL_S, TYPING_REST_S, DiagApp
from tui.log_files import read_log_tail
from tui.grid_model import (CULPRIT, DEAD, ENDED, IDLE, RUNNING, WAITING, build_grid,
                            default_selection, move)
from tui.quit_screen import QuitScreen
from tui.rank_detail import RankDetail
from tui.rank_grid import RankGrid
from tui.verdict_bar import VerdictBar

REPO = Path(__file__).parent.parent


# -- the grid model

def test_grid_model_states_for_rank6_fault():
    snapshot = rank6_never_reached()
    model = build_grid(snapshot, analyze(snapshot))
    assert not model.grouped
    assert [row.stage for row in model.rows] == [0, 1, 2, 3]
    assert model.cells[6].state == CULPRIT
    assert {model.cells[rank].state for rank in (0, 1, 2, 3, 4, 5, 7)} == {WAITING}
    assert (model.cells[7].phase, model.cells[7].step) == ("forward", 0)
    assert model.cells[7].last_collective == "tp3 all_reduce #0 waiting"
    assert model.cells[6].heartbeat_age == pytest.approx(0.05)


def test_grid_model_no_fault_states():
    snapshot = no_fault()
    model = build_grid(snapshot, analyze(snapshot))
    assert [model.cells[rank].state for rank in range(TP * PP)] == [IDLE] * 6 + [RUNNING] * 2


def test_grid_model_filter_and_moves():
    snapshot = rank6_never_reached()
    verdicts = analyze(snapshot)
    assert build_grid(snapshot, verdicts, "culprit").selectable_rows() == [[6]]
    assert build_grid(snapshot, verdicts, "forw").selectable_rows() == [[7]]
    model = build_grid(snapshot, verdicts)
    assert move(model, 0, 1, 0) == 1 and move(model, 1, 1, 0) == 1
    assert move(model, 1, 0, 3) == 7 and move(model, 7, 0, 5) == 7
    assert move(model, None, 0, 1) == 0


def test_grid_groups_many_ranks_and_keeps_the_culprit_named():
    job = Job(tp=16, pp=8)
    t = job.everyone_started()
    for rank in job.ranks:
        job.dequeue(rank, t)
    for gone in (88, 90, 100):
        job.ranks[gone].alive = False
    verdicts = [Verdict("never_reached", [70], [71, 72], "rank 70 never reached execute_model"),
                Verdict("dead", [88], [90], "rank 88 died; rank 90 died after it")]
    model = build_grid(settle(job, t + 1.0), verdicts)
    assert model.grouped
    described = [(line.first_stage, line.last_stage, line.counts, line.named) for line in model.groups]
    assert described == [   # rank 100 is gone, and no verdict calls that a death
        (0, 3, {IDLE: 16}, {}),
        (4, 4, {CULPRIT: 1, WAITING: 2, IDLE: 13}, {CULPRIT: [70]}),
        (5, 5, {DEAD: 2, IDLE: 14}, {DEAD: [88, 90]}),     # the first death is dead too
        (6, 6, {IDLE: 15, ENDED: 1}, {}),
        (7, 7, {IDLE: 16}, {}),
    ]
    assert model.groups[1].ranks[:3] == [70, 71, 72]
    assert default_selection(model) == 70
    assert default_selection(build_grid(settle(job, t + 1.0), verdicts[1:])) == 88  # first death


def test_log_tail_prefers_the_rank_output_then_its_nccl_log(tmp_path):
    assert read_log_tail(str(tmp_path), 3).name is None
    (tmp_path / "nccl-rank-3.log").write_text("".join(f"NCCL INFO line {i}\n" for i in range(100)))
    tail = read_log_tail(str(tmp_path), 3)
    assert tail.name == "nccl-rank-3.log" and tail.lines[-1] == "NCCL INFO line 99" and len(tail.lines) == 20
    (tmp_path / "rank-3.log").write_text("loading weights\n")
    assert read_log_tail(str(tmp_path), 3).lines == ["loading weights"]


# -- the app, through Pilot

@pytest.mark.anyio
async def test_culprit_cell_verdict_and_stack_on_screen():
    app = DiagApp(SyntheticSource(rank6_never_reached()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert "rank 6 (pp 3/4, tp 0) never reached execute_model" in text
        assert "▸rank 6  CULPRIT" in text  # the culprit is selected from the start
        assert "rank 7  WAITING" in text and "rank 0  WAITING" in text
        assert app.query_one(RankDetail).view.state.identity.rank == 6
        assert "stack (dump)" in text and "diagnose/faults.py:170 block_forever" in text
        assert "read-only" in text


RECORDED = Path(__file__).parent / "fixtures" / "runs"


@pytest.mark.anyio
async def test_recorded_rank6_run_names_the_culprit_with_its_stack():
    """A run dir recorded by diag launch over the real engine (tp=2 pp=4, rank 6
    hung before its first execute_model, then the launcher ended the run)."""
    app = DiagApp(open_run_dir(str(RECORDED / "rank6_never_reached")))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert "rank 6 (pp 3/4, tp 0) never reached execute_model" in text
        assert "▸rank 6  CULPRIT" in text
        assert app.query_one(RankDetail).view.state.identity.rank == 6
        assert "block_forever" in text  # the stack the probe dumped on the hang
        await pilot.press("right")
        assert app.selected_rank == 7


class HeldRunDir(RunDirSource):
    """The run dir's own source, its reads held until the test lets them go: a
    read and judgment of 16,384 ranks take seconds, of this recorded run none."""

    def __init__(self, run_dir: str) -> None:
        super().__init__(run_dir)
        self.release = threading.Event()

    def judged(self):
        self.release.wait(30)
        return super().judged()


def bar_text(app) -> str:
    return app.query_one(VerdictBar).render().plain


@pytest.mark.anyio
async def test_diag_launchs_verdict_shows_at_once_and_the_views_own_replaces_it(tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED / "rank6_never_reached", run_dir)
    snapshot = open_run_dir(str(run_dir)).snapshot()
    judged_file.write(str(run_dir), snapshot, analyze(snapshot))   # as diag launch does
    source = HeldRunDir(str(run_dir))
    app = DiagApp(source)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: "as diag launch judged it at" in bar_text(app))
            assert bar_text(app).startswith("rank 6 (pp 3/4, tp 0) never reached execute_model")
            assert app.snapshot is None                    # before any read of its own
            source.release.set()
            await until(pilot, lambda: "▸rank 6  CULPRIT" in screen_text(app))
            assert "as diag launch judged" not in bar_text(app)
            assert bar_text(app).startswith("rank 6 (pp 3/4, tp 0) never reached execute_model")
    finally:
        source.release.set()


@pytest.mark.anyio
async def test_diag_launchs_verdict_on_newer_ranks_than_the_views_stays_and_says_so(tmp_path):
    """A head's node files lag what it holds by up to 10 s: diag tui's own first
    judgment of a live 4,096-rank head dir said no hang 0.8 s after it had shown the
    head's culprit. Here the launcher judged the same hang on ranks 5 s newer."""
    run_dir = tmp_path / "run"
    shutil.copytree(RECORDED / "no_fault", run_dir)
    hung = open_run_dir(str(RECORDED / "rank6_never_reached")).snapshot()
    own = open_run_dir(str(run_dir)).snapshot()
    judged_file.write(str(run_dir), replace(hung, taken_at=own.taken_at + 5.0), analyze(hung))
    app = DiagApp(RunDirSource(str(run_dir)))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await until(pilot, lambda: "the ranks below are as of" in bar_text(app))
        assert bar_text(app).startswith("rank 6 (pp 3/4, tp 0) never reached execute_model")
        assert app.verdicts == [] and CULPRIT not in screen_text(app)   # the grid is its own


@pytest.mark.anyio
async def test_recorded_no_fault_run_says_no_hang():
    app = DiagApp(open_run_dir(str(RECORDED / "no_fault")))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert "no hang detected" in text and CULPRIT not in text


@pytest.mark.anyio
async def test_no_fault_says_no_hang():
    app = DiagApp(SyntheticSource(no_fault()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert "no hang detected" in text
        assert text.count(f"  {RUNNING}") == 2 and text.count(f"  {IDLE}") == 6


@pytest.mark.anyio
async def test_no_read_begins_while_keys_come_and_a_selection_reads_only_its_log(tmp_path):
    """Every whole read of the source begins TYPING_REST_S or more after the last key
    the app had then; keys come every tenth of a second or so until rank 7's log
    shows, so that log came from the selection's own read, and the reads go on once
    the keys stop. Each read is noted when the app begins it, on its UI thread."""
    (tmp_path / "rank-7.log").write_text("step 0: waiting on tp3\n")
    app = DiagApp(SyntheticSource(rank6_never_reached(str(tmp_path))))
    began: list[tuple[float, float]] = []      # (when a read began, the app's last key then)
    read_source = app.read_source

    def noted(rank, query):
        began.append((time.monotonic(), app.typed_at))
        return read_source(rank, query)
    app.read_source = noted
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await until(pilot, lambda: len(began) >= 3)               # the timer reads
        await pilot.press("right")                                # rank 7
        first_key = app.typed_at
        typing_ends = time.monotonic() + 2 * TYPING_REST_S
        while time.monotonic() < typing_ends or "log (rank-7.log)" not in screen_text(app):
            assert time.monotonic() < typing_ends + 10, "rank 7's log did not show"
            await pilot.press("left", "right")
            await pilot.pause(0.1)
        last_key = app.typed_at
        await until(pilot, lambda: began[-1][1] >= last_key, timeout=5 * TYPING_REST_S)
    after_keys = [(at, key) for at, key in began if key >= first_key]
    assert after_keys and all(at - key >= TYPING_REST_S for at, key in after_keys), after_keys


@pytest.mark.anyio
async def test_keys_move_selection_and_show_the_log(tmp_path):
    (tmp_path / "rank-7.log").write_text("loading weights\nstep 0: waiting on tp3\n")
    app = DiagApp(SyntheticSource(rank6_never_reached(str(tmp_path))))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        grid = app.query_one(RankGrid)
        await pilot.press("right")
        assert grid.selected == 7
        await pilot.press("up", "left")
        assert grid.selected == 4
        await pilot.press("down", "right")
        assert grid.selected == 7
        await pilot.pause(0.4)  # the selection reads rank 7's log
        text = screen_text(app)
        assert "log (rank-7.log)" in text and "step 0: waiting on tp3" in text
        assert "stack (probe)" in text and "engine/communicator.py:52 all_reduce" in text  # no dump
        await pilot.press("enter")
        assert app.focused is app.query_one(RankDetail)


@pytest.mark.anyio
async def test_filter_by_state():
    app = DiagApp(SyntheticSource(rank6_never_reached()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("slash", *"forward", "enter")
        await pilot.pause()
        text = screen_text(app)
        assert "rank 7  WAITING" in text
        assert "rank 6  CULPRIT" not in text and "rank 0  WAITING" not in text
        assert app.query_one(RankGrid).selected == 7
        assert "filter: forward" in text
        await pilot.press("slash", *"culprit", "enter")
        await pilot.pause()
        assert "rank 6  CULPRIT" in screen_text(app) and "rank 7  WAITING" not in screen_text(app)


@pytest.mark.anyio
async def test_controller_keys_and_quit_modal_stop():
    controller = RecordingController()
    app = DiagApp(SyntheticSource(rank6_never_reached()), controller)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("b")
        assert controller.calls == [("toggle_launch_blocking", 6)]
        await pilot.pause()
        assert "CUDA_LAUNCH_BLOCKING=1 at the next restart: rank 6" in str(app.query_one("#status", Static).content)
        await pilot.press("r")
        await app.workers.wait_for_complete()
        assert ("restart",) in controller.calls
        await pilot.press("q")
        assert isinstance(app.screen, QuitScreen)
        assert "stop the job, or leave it running?" in screen_text(app)
        await pilot.press("s")
        await pilot.pause()
    assert controller.calls[-1] == ("stop",)
    assert app.return_code == 0


@pytest.mark.anyio
async def test_quit_modal_leave_running_and_cancel():
    controller = RecordingController()
    app = DiagApp(SyntheticSource(rank6_never_reached()), controller)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("q", "escape")
        assert not isinstance(app.screen, QuitScreen) and app.is_running
        await pilot.press("q", "l")
        await pilot.pause()
    assert controller.calls == []


@pytest.mark.anyio
async def test_without_controller_b_and_r_are_not_offered_and_q_quits_at_once():
    app = DiagApp(SyntheticSource(rank6_never_reached()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        keys = offered(app)
        assert "Restart" not in keys and "Launch-blocking" not in keys
        assert "py-spy" in keys and "Dump all" in keys      # the job may still run
        await pilot.press("q")
        await pilot.pause()
        assert not app.is_running


class StallingSource(SyntheticSource):
    """Answers once; then every read blocks (as on a hung network mount) or fails."""

    def __init__(self, snapshot: Snapshot, fail: bool) -> None:
        super().__init__(snapshot)
        self.fail = fail
        self.reads = 0
        self.release = threading.Event()

    def snapshot(self) -> Snapshot:
        self.reads += 1
        if self.reads > 1 and self.fail:
            raise OSError("run dir gone")
        if self.reads > 1:
            self.release.wait()
        return self.fixed


@pytest.mark.anyio
async def test_a_blocked_read_never_blocks_the_screen():
    source = StallingSource(rank6_never_reached(), fail=False)
    app = DiagApp(source)
    try:
        async with app.run_test(size=SIZE) as pilot:
            await started(app, pilot)
            await pilot.pause(4 * POLL_INTERVAL_S)
            assert source.reads == 2  # one read in flight at a time, no pile-up
            await pilot.press("right")
            assert app.query_one(RankGrid).selected == 7
            assert "rank 7 · stage 3 · tp 1 · WAITING" in screen_text(app)
    finally:
        source.release.set()


@pytest.mark.anyio
async def test_a_failed_read_keeps_the_last_snapshot_and_says_why():
    app = DiagApp(StallingSource(rank6_never_reached(), fail=True))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await until(pilot, lambda: "reading the run dir failed: run dir gone" in str(app.query_one("#status", Static).content))
        assert "▸rank 6  CULPRIT" in screen_text(app)


# -- screens

def test_screen_rank6_never_reached(snap_compare):
    assert snap_compare(DiagApp(SyntheticSource(rank6_never_reached())), terminal_size=SIZE,
                        run_before=wait_for_first_poll)


def test_screen_no_fault(snap_compare):
    assert snap_compare(DiagApp(SyntheticSource(no_fault())), terminal_size=SIZE,
                        run_before=wait_for_first_poll)


async def wait_for_first_poll(pilot) -> None:
    await started(pilot.app, pilot)


# -- a real run dir: two probed processes, the real collector, dumps and py-spy

PROBED_RANK = """
import sys, time
from diagnose import probe
rank = int(sys.argv[1])
probe.init("worker", rank=rank, world_size=2, tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1)
with probe.phase("warmup"):
    pass
def wait_for_work():
    with probe.phase("dequeue", step=0):
        print("ready", flush=True)
        while True:
            time.sleep(0.02)
wait_for_work()
"""


@pytest.fixture
def probed_run(tmp_path):
    """A run dir with two live ranks idle in dequeue, each logging to rank-R.log."""
    env = dict(os.environ, DIAG_RUN_DIR=str(tmp_path))
    procs = []
    try:
        for rank in range(2):
            log = open(tmp_path / f"rank-{rank}.log", "w")
            procs.append(subprocess.Popen([sys.executable, "-c", PROBED_RANK, str(rank)], env=env,
                                          cwd=REPO, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        deadline = time.monotonic() + 30
        while not all("ready" in (tmp_path / f"rank-{r}.log").read_text() for r in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
            time.sleep(0.05)
        yield tmp_path
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


@pytest.mark.anyio
async def test_live_run_dir_dump_py_spy_and_log(probed_run):
    app = DiagApp(open_run_dir(str(probed_run)))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "rank 0  IDLE" in screen_text(app) and "rank 1  IDLE" in screen_text(app)
        await pilot.press("d")
        await until(pilot, lambda: "stack (dump)" in screen_text(app))
        assert "wait_for_work" in screen_text(app)
        await until(pilot, lambda: "log (rank-0.log)" in screen_text(app))
        assert "ready" in screen_text(app)
        await pilot.press("right", "s")
        await until(pilot, lambda: "stack (py-spy)" in screen_text(app))
        text = screen_text(app)
        assert "rank 1 · stage 0 · tp 1" in text and "wait_for_work" in text


# -- `diag tui` on a bad run dir

@pytest.mark.parametrize("make, says", [("missing", "no run dir at"),
                                        ("file", "is not a run dir"),
                                        ("empty", "no readable probe file in"),
                                        ("unreadable", "cannot read any probe file")])
def test_bad_run_dir_is_one_line(tmp_path, make, says):
    run_dir = tmp_path / "run"
    if make == "file":
        run_dir.write_text("not a dir")
    elif make != "missing":
        run_dir.mkdir()
    if make == "unreadable":
        (run_dir / "rank-0.probe").write_bytes(b"\x07" * 64)
    result = diag("tui", run_dir)
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("diag: error: ")
    assert says in result.stderr


@pytest.mark.anyio
async def test_the_poll_makes_the_grid_off_the_ui_thread_and_a_new_filter_on_it(tmp_path, monkeypatch):
    """At 16,384 ranks a grid takes a quarter of a second to make: each read's is
    made by the reading thread and shown as it is; a filter typed since is made
    for at once on the UI thread, and by the reads after it off that thread again."""
    made: list[tuple[bool, str]] = []           # (on the UI thread, the filter)
    build = tui_app.build_grid

    def noted(snapshot, verdicts, query=""):
        made.append((threading.current_thread() is threading.main_thread(), query))
        return build(snapshot, verdicts, query)
    monkeypatch.setattr(tui_app, "build_grid", noted)
    app = DiagApp(SyntheticSource(rank6_never_reached(str(tmp_path))))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await until(pilot, lambda: len(made) >= 3)
        assert made[:3] == [(False, "")] * 3
        assert app.query_one(RankGrid).model == app.made[1]
        await pilot.press("slash", "7", "enter")
        await until(pilot, lambda: (True, "7") in made)
        await until(pilot, lambda: made[-1] == (False, "7"), timeout=5 * TYPING_REST_S)
