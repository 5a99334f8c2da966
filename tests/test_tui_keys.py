"""The TUI's keys as a first-time user meets them: ? / F1 / h list every key,
the arrows move and h/j/k/l do not (htop's users know h as help and k as kill),
the `/` filter takes rank numbers and ranges, and a job that is over quits at
`q` without asking."""
from __future__ import annotations

from dataclasses import replace

import pytest

from diagnose.analysis import analyze
from diagnose.core.vocab import Phase
from helpers.synthetic import Job
from helpers.tui_synthetic import (SIZE, TP, PP, RecordingController, SyntheticSource, offered,
                      rank6_never_reached, screen_text, started)
from tui.app import DiagApp
from tui.grid_model import DEAD, EXITED, build_grid
from tui.help_screen import HelpScreen
from tui.quit_screen import QuitScreen
from tui.rank_detail import RankDetail
from tui.rank_grid import RankGrid


def ended_cleanly(run_dir: str = "/runs/ended"):
    """Three healthy steps, then every rank and the driver ended normally (their
    probes entered Phase.EXIT last) and the command exited 0."""
    job = Job(TP, PP)
    t = job.healthy(steps=3, start=job.everyone_started(start=0.0, seconds=1.0))
    end = t + 1.0   # after the last stage's last step
    for state in [*job.ranks.values(), job.driver]:
        job.phase(state, Phase.EXIT, end, end + 0.001)
        state.alive, state.heartbeat_at = False, end
    job.command_exit, job.now = 0, end + 1.0
    return replace(job.snapshot(), run_dir=run_dir)


def every_help_line(app: DiagApp) -> list[str]:
    bindings = [*RankGrid.BINDINGS, *DiagApp.BINDINGS, *QuitScreen.BINDINGS]
    return [binding.tooltip or binding.description for binding in bindings]


@pytest.mark.anyio
async def test_question_mark_f1_and_h_open_the_help_and_it_lists_every_key():
    app = DiagApp(SyntheticSource(rank6_never_reached()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        for key in ("question_mark", "f1", "h"):
            await pilot.press(key)
            assert isinstance(app.screen, HelpScreen), key
            text = screen_text(app)
            missing = [line for line in every_help_line(app) if line not in text]
            assert not missing
            assert "↑ ↓ ← →" in text and "? f1 h" in text and "q ^q" in text
            await pilot.press("escape")
            assert not isinstance(app.screen, HelpScreen)


@pytest.mark.anyio
async def test_arrows_move_and_j_k_l_do_nothing():
    app = DiagApp(SyntheticSource(rank6_never_reached()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        grid = app.query_one(RankGrid)
        assert grid.selected == 6
        await pilot.press("j", "k", "l")
        assert grid.selected == 6 and app.screen is app.screen_stack[0]
        await pilot.press("up", "right")
        assert grid.selected == 5


def test_screen_help(snap_compare):
    async def open_help(pilot) -> None:
        await started(pilot.app, pilot)
        await pilot.press("question_mark")
    assert snap_compare(DiagApp(SyntheticSource(rank6_never_reached())), terminal_size=SIZE,
                        run_before=open_help)


def test_the_filter_takes_rank_numbers_and_ranges():
    snapshot = rank6_never_reached()
    verdicts = analyze(snapshot)
    assert build_grid(snapshot, verdicts, "7").selectable_rows() == [[7]]
    assert build_grid(snapshot, verdicts, "0-3").selectable_rows() == [[0, 1], [2, 3]]
    assert build_grid(snapshot, verdicts, "0-1, 6").selectable_rows() == [[0, 1], [6]]
    assert build_grid(snapshot, verdicts, "waiting").selectable_rows() == [[0, 1], [2, 3], [4, 5], [7]]
    assert build_grid(snapshot, verdicts, "9").selectable_rows() == []


@pytest.mark.anyio
async def test_slash_1000_finds_rank_1000_of_1024():
    job = Job(tp=16, pp=64)
    t = job.everyone_started()
    for rank in job.ranks:
        job.dequeue(rank, t)
    job.now = t + 1.0
    app = DiagApp(SyntheticSource(job.snapshot()))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.press("slash", *"1000", "enter")
        await pilot.pause()
        assert app.query_one(RankGrid).model.groups[0].ranks == [1000]
        assert app.query_one(RankGrid).selected == 1000
        assert "stage 62: 1 IDLE" in screen_text(app)
        await pilot.press("slash", *"5000", "enter")
        await pilot.pause()
        assert "no rank matches the filter '5000'" in screen_text(app)


def test_ranks_that_ended_normally_are_exited_not_dead():
    snapshot = ended_cleanly()
    assert analyze(snapshot) == []
    states = {cell.state for cell in build_grid(snapshot, []).cells.values()}
    assert states == {EXITED} and DEAD not in states
    assert build_grid(snapshot, [], "exited").selectable_rows() == [[0, 1], [2, 3], [4, 5], [6, 7]]


@pytest.mark.anyio
async def test_q_on_a_job_that_is_over_quits_without_asking():
    controller = RecordingController()
    app = DiagApp(SyntheticSource(ended_cleanly()), controller)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert text.count("  EXITED") == TP * PP and "DEAD" not in text
        assert "after sample · step 2" in text and "command exited 0" in text
        keys = offered(app)
        for key in ("Restart", "Launch-blocking", "py-spy", "native", "Dump all"):
            assert key not in keys          # none of them can act on a job that is over
        assert {"Help", "Detail", "Quit"} <= keys
        await pilot.press("r", "b")
        await pilot.press("q")
        await pilot.pause()
        assert not isinstance(app.screen, QuitScreen) and not app.is_running
    assert controller.calls == []


def footer_keys(app: DiagApp) -> list:
    return list(app.screen.query("FooterKey"))


@pytest.mark.anyio
async def test_the_footer_is_built_again_only_when_the_keys_it_offers_change():
    source = SyntheticSource(rank6_never_reached())
    app = DiagApp(source, RecordingController())
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        await pilot.pause()
        before = footer_keys(app)
        assert "Restart" in {key.description for key in before}
        await pilot.press("enter")                   # the detail takes the focus
        await pilot.pause()
        assert isinstance(app.focused, RankDetail)
        assert footer_keys(app) == before            # the same widgets: nothing built again
        source.fixed = ended_cleanly(source.run_dir)  # the job ends: Restart can act no more
        for _ in range(100):
            await pilot.pause(0.05)
            if app.job_over:
                break
        await pilot.pause()
        after = {key.description: key for key in footer_keys(app)}
        assert "Restart" not in after and {"Help", "Detail", "Quit"} <= set(after)
        assert not set(after.values()) & set(before)
