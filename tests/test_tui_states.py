"""What the TUI says before the job has a rank and while its ranks start, and
the command's own output (output.log in the run dir): its pane, and the server
address it announced."""
from __future__ import annotations

import re
import time

import pytest

from diagnose.core.snapshot import Snapshot
from helpers.synthetic import Job
from helpers.tui_synthetic import (SIZE, SyntheticSource, offered, rank6_never_reached, screen_text, started,
                      until)
from tui.app import DiagApp
from tui.grid_model import build_grid
from tui.output_pane import OutputPane
from tui.rank_grid import cell_lines
from tui.status import no_ranks_text


class StartingSource(SyntheticSource):
    """No rank for the first `empty_polls` polls, as while a job imports torch;
    then the hung tp=2 pp=4 job."""

    def __init__(self, empty_polls: int) -> None:
        super().__init__(rank6_never_reached())
        self.polls, self.empty_polls = 0, empty_polls

    def snapshot(self) -> Snapshot:
        self.polls += 1
        if self.polls <= self.empty_polls:
            return Snapshot(time.time(), self.fixed.run_dir, {})
        return self.fixed


@pytest.mark.anyio
async def test_before_the_first_rank_it_says_it_waits_not_that_no_rank_matches():
    source = StartingSource(empty_polls=10**6)
    app = DiagApp(source)
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        text = screen_text(app)
        assert re.search(r"waiting for the job's ranks to start \(\d+ s\)", text)
        assert "no rank matches" not in text and "0 ranks" not in text
        source.empty_polls = 0
        await until(pilot, lambda: "▸rank 6  CULPRIT" in screen_text(app))


def test_the_wait_counts_seconds_from_the_tui_start_and_names_the_command():
    said = no_ranks_text(Snapshot(107.2, "/run", {}), started_at=100.0,
                         command=["python", "-m", "engine", "generate", "--prompt", "hi there"])
    first, second = said.split("\n")
    assert first == "the command: python -m engine generate --prompt 'hi there'"
    assert second.startswith("waiting for the job's ranks to start (7 s): for a process to start "
                             "the probe")


@pytest.mark.anyio
async def test_a_command_that_ends_before_any_rank_is_said_so():
    ended = Snapshot(time.time(), "/runs/none", {}, command_exit=1)
    app = DiagApp(SyntheticSource(ended))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert "the command exited 1 before any rank started" in screen_text(app)


SERVING = "INFO engine: serving tiny-llama (tp=2 pp=4) on http://127.0.0.1:8000"


@pytest.mark.anyio
async def test_the_output_pane_shows_the_command_output_and_the_status_its_server(tmp_path):
    (tmp_path / "output.log").write_text(f"loading weights\n{SERVING}\n")
    app = DiagApp(SyntheticSource(rank6_never_reached(str(tmp_path))))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        pane = app.query_one(OutputPane)
        text = screen_text(app)
        assert pane.display and "command output (output.log)" in text and SERVING in text
        assert "server at http://127.0.0.1:8000" in text
        with open(tmp_path / "output.log", "a") as log:
            log.write("'hi' -> 'hello there'\n")
        await until(pilot, lambda: "'hi' -> 'hello there'" in screen_text(app))
        await pilot.press("o")
        assert not pane.display and SERVING not in screen_text(app)
        assert "server at http://127.0.0.1:8000" in screen_text(app)  # the status keeps it
        await pilot.press("o")
        assert pane.display


@pytest.mark.anyio
@pytest.mark.parametrize("output", [None, ""])
async def test_no_output_pane_nor_its_key_before_the_command_printed_anything(tmp_path, output):
    if output is not None:
        (tmp_path / "output.log").write_text(output)
    app = DiagApp(SyntheticSource(rank6_never_reached(str(tmp_path))))
    async with app.run_test(size=SIZE) as pilot:
        await started(app, pilot)
        assert not app.query_one(OutputPane).display
        assert "Output" not in offered(app)      # the footer offers no key that cannot act
        await pilot.press("o")
        assert not app.query_one(OutputPane).display


def test_a_starting_rank_shows_its_start_up_phase_and_how_long_it_has_been_in_it():
    job = Job(tp=1, pp=2, now=1000.0)
    for rank, state in job.ranks.items():
        job.phase(state, "init_distributed", 980.0, 985.0)
        job.phase(state, "load_weights", 985.0, None if rank == 1 else 987.0)
        state.heartbeat_at = 999.9
    job.phase(job.ranks[0], "init_kv_cache", 987.0, 990.0)
    job.phase(job.ranks[0], "dequeue", 990.0, None, step=0)
    cells = build_grid(job.snapshot(), []).cells
    assert cell_lines(cells[1], False)[1] == " load_weights · 15 s"
    assert cell_lines(cells[0], False)[1] == " dequeue · step 0"       # no longer starting
