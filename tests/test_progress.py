"""diagnose.core.progress in-process (the engine's start-up and diag's long reads report
through it): one line per stage when stderr is not a terminal, a rich bar (then the same
line) when it is, nothing when the stage fails. That only rank 0 of a
multi-rank job reports is checked on a real server's log in test_server.py."""
from __future__ import annotations

import io
import re
import sys

import pytest

from diagnose.core import progress


def test_without_a_terminal_each_stage_is_one_line(capsys):
    assert list(progress.track([1, 2, 3], "loading things", "things")) == [1, 2, 3]
    out, err = capsys.readouterr()
    assert out == "" and re.fullmatch(r"loading things: 3 things in \d+\.\d s\n", err)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_bar_runs_then_the_line_stays(monkeypatch):
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    seen = []
    for item in progress.track(["a.weight", "b.weight"], "loading weights", "tensors", str.upper):
        seen.append(item)
    text = terminal.getvalue()
    assert seen == ["a.weight", "b.weight"]
    assert "\x1b[" in text and "2/2" in text and "B.WEIGHT" in text    # drawn live, with the detail
    assert re.search(r"\x1b\[2Kloading weights: 2 tensors in \d+\.\d s\n$", text), repr(text[-200:])


def test_a_stage_that_fails_says_nothing(capsys):
    with pytest.raises(RuntimeError):
        for item in progress.track([1, 2], "loading", "things"):
            raise RuntimeError(item)
    assert capsys.readouterr().err == ""


def test_diag_reads_many_flight_recorder_dumps_and_big_logs_with_a_bar(monkeypatch, tmp_path):
    from diagnose.offline import logs, synth_fr
    from diagnose.offline.flight_recorder import read_fr_dir

    synth_fr.write_fr_dumps(str(tmp_path / "fr"), 64, 8, 5, 20)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert len(read_fr_dir(str(tmp_path / "fr")).snapshot.ranks) == 64
    assert "reading 64 Flight Recorder dumps" in terminal.getvalue()
    assert "64/64" in terminal.getvalue()

    monkeypatch.setattr(logs, "BAR_FROM_MB", 0)
    log = tmp_path / "big.log"
    log.write_bytes(b"INFO nothing wrong here\n" * 50_000)
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert logs.scan_files([str(log)]).findings == []
    assert "reading logs" in terminal.getvalue() and "big.log" in terminal.getvalue()


def test_small_reads_draw_no_bar(monkeypatch):
    from diagnose.offline import logs
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    logs.scan_files(["tests/fixtures/logs/vllm_tp2_hang.log"])
    assert terminal.getvalue() == ""
