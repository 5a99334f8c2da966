"""What the probe runs inside someone else's import never fails that import:
torch_dist.on_import's callbacks (the vLLM plugin's hooks among them) are
guarded, and an error is a note for the run's report (notes.jsonl)."""
from __future__ import annotations

import importlib
import sys

import pytest

from diagnose import probe
from diagnose.probe import notes, torch_dist

pytestmark = pytest.mark.unit


def test_a_failing_callback_is_a_note_and_the_import_and_the_next_callback_go_on(
        tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (tmp_path / "hooked_elsewhere.py").write_text("VALUE = 42\n")
    monkeypatch.setenv(probe.RUN_DIR_VAR, str(run_dir))
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []

    def broken(module):
        raise AttributeError("type object 'FutureWrapper' has no attribute '_wait_for_response'")

    torch_dist.on_import("hooked_elsewhere", broken)
    torch_dist.on_import("hooked_elsewhere", lambda module: seen.append(module.VALUE))
    try:
        module = importlib.import_module("hooked_elsewhere")
    finally:
        sys.modules.pop("hooked_elsewhere", None)
    assert module.VALUE == 42 and seen == [42]
    [note] = notes.read(str(run_dir))
    assert note.startswith("hangscope: its hook on hooked_elsewhere failed")
    assert "AttributeError" in note and "_wait_for_response" in note


def test_a_failing_callback_on_a_module_already_imported_is_a_note_too(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.RUN_DIR_VAR, str(tmp_path))
    torch_dist.on_import("json", lambda module: 1 / 0)
    assert notes.read(str(tmp_path)) == [
        "hangscope: its hook on json failed and was left out (ZeroDivisionError: division by "
        "zero); the program went on without it"]


def test_notes_are_read_once_each_in_order_and_bounded(tmp_path, monkeypatch):
    monkeypatch.setenv(probe.RUN_DIR_VAR, str(tmp_path))
    for text in ("b", "a", "b", "x" * 1000):
        notes.note(text)
    (tmp_path / notes.NOTES_FILE).open("a").write("not json\n{\"note\": 3}\n")
    assert notes.read(str(tmp_path)) == ["b", "a", "x" * notes.NOTE_CHARS]
    assert notes.read(str(tmp_path / "nowhere")) == []
