"""judged.json, diag launch's latest verdicts for `diag tui` to show first: what
is written is read back whole, and a file that is not whole, not diag's or not
a file reads as none (the TUI then judges for itself, as without one)."""
import json
import os

import pytest

from diagnose.analysis import analyze
from diagnose.core.schema import CURRENT, Document
from diagnose.core.vocab import VerdictKind
from diagnose.launch import judged_file
from helpers.tui_synthetic import rank6_never_reached

pytestmark = pytest.mark.unit


def written(run_dir) -> dict:
    snapshot = rank6_never_reached()
    judged_file.write(str(run_dir), snapshot, analyze(snapshot))
    return json.loads((run_dir / judged_file.NAME).read_text())


def test_what_the_launcher_wrote_is_read_back_whole(tmp_path):
    snapshot = rank6_never_reached()
    verdicts = analyze(snapshot)
    judged_file.write(str(tmp_path), snapshot, verdicts)
    judged = judged_file.read(str(tmp_path))
    assert judged.verdicts == verdicts and judged.verdicts[0].kind == VerdictKind.NEVER_REACHED
    assert judged.taken_at == snapshot.taken_at
    assert os.listdir(tmp_path) == [judged_file.NAME]          # the part renamed, none left


@pytest.mark.parametrize("garble", [
    lambda body: "not json{",
    lambda body: json.dumps(body | {"version": CURRENT[Document.JUDGED] + 1}),
    lambda body: json.dumps(body | {"taken_at": "16"}),
    lambda body: json.dumps(body | {"verdicts": [body["verdicts"][0] | {"kind": "nope"}]}),
    lambda body: json.dumps(body | {"verdicts": [body["verdicts"][0] | {"culprit_ranks": "6"}]}),
    lambda body: json.dumps(body | {"verdicts": [body["verdicts"][0] | {"spans": [
        {"start": 0, "end": 4, "mention": "everyone"}]}]}),
    lambda body: json.dumps([body]),
])
def test_a_judgment_not_whole_or_not_diags_reads_as_none(tmp_path, garble):
    body = written(tmp_path)
    (tmp_path / judged_file.NAME).write_text(garble(body))
    assert judged_file.read(str(tmp_path)) is None


def test_a_fifo_or_an_outsized_file_is_not_read(tmp_path, monkeypatch):
    assert judged_file.read(str(tmp_path)) is None                  # none written
    os.mkfifo(tmp_path / judged_file.NAME)
    assert judged_file.read(str(tmp_path)) is None                  # and no wait on it
    os.remove(tmp_path / judged_file.NAME)
    size = len(json.dumps(written(tmp_path)))
    monkeypatch.setattr(judged_file, "MAX_BYTES", size - 1)
    assert judged_file.read(str(tmp_path)) is None


def test_the_tuis_reader_reads_again_only_a_file_that_changed(tmp_path):
    reader = judged_file.Reader(str(tmp_path))
    assert reader.read() is None
    written(tmp_path)
    first = reader.read()
    assert first is not None and reader.read() is first
    snapshot = rank6_never_reached()
    judged_file.write(str(tmp_path), snapshot, [])
    assert reader.read().verdicts == []
