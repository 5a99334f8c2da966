"""engine.progress in-process: one line per stage when stderr is not a terminal, a rich bar
(then the same line) when it is, nothing when the stage fails. That only rank 0 of a
multi-rank job reports is checked on a real server's log in test_server.py."""
from __future__ import annotations

import io
import re
import sys

import pytest

from engine import progress


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
