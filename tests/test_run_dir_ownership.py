"""diag launch deletes or overwrites only what diag wrote: a run dir it did not
make (no marker of diag's) is refused whole if it holds anything, and so are
`/`, $HOME and the system's directories; a run dir of diag's is used again."""
import json
import os
import subprocess

import pytest

from diagnose.launch import claim, dump
from helpers.run import diag

pytestmark = pytest.mark.e2e

# Named as diag names its own files: each of these was deleted or overwritten once.
CANARIES = ["data.probe", "0.probe", "marks.jsonl", "node-config.json", "report.json",
            "exit.json", "output.log", "launch.json", "launch.lock", "stacks-0.json",
            "error-1.json", "fatal-2.txt"]


def tree(root) -> dict[str, tuple]:
    """Every entry under root: its bytes (for files) and mtime."""
    found = {}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(parent, name)
            data = open(path, "rb").read() if os.path.isfile(path) else None
            found[os.path.relpath(path, root)] = (data, os.lstat(path).st_mtime_ns)
    return found


def refused(done: subprocess.CompletedProcess, says: str) -> None:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and says in lines[0], done.stderr


def test_twelve_canaries_survive_and_slash_is_refused(tmp_path):
    canaries = tmp_path / "mine"
    canaries.mkdir()
    for name in CANARIES:
        (canaries / name).write_text(f"canary {name}\n")
    before = tree(canaries)
    assert len(before) == 12
    refused(diag("launch", "--run-dir", str(canaries), "--", "true"),
            "holds files that diag did not write")
    assert tree(canaries) == before
    root_before = set(os.listdir("/"))
    refused(diag("launch", "--run-dir", "/", "--", "true"), "system or home directory")
    assert set(os.listdir("/")) == root_before
    assert tree(canaries) == before


def test_a_sub_directory_is_refused_too_with_nothing_deleted(tmp_path):
    run_dir = tmp_path / "mine"
    (run_dir / "report.json").mkdir(parents=True)
    (run_dir / "0.probe").write_text("mine")
    before = tree(run_dir)
    refused(diag("launch", "--run-dir", str(run_dir), "--", "true"),
            "holds files that diag did not write")
    assert tree(run_dir) == before


@pytest.mark.parametrize("where", ["home", "/usr", "/var/tmp", "/etc/diag-run", "/tmp"])
def test_home_and_system_directories_are_refused(tmp_path, where):
    home = tmp_path / "home"
    home.mkdir()
    run_dir = str(home) if where == "home" else where
    done = diag("launch", "--run-dir", run_dir, "--", "true", env=dict(os.environ, HOME=str(home)))
    refused(done, "system or home directory")
    assert os.listdir(home) == [] and not os.path.exists("/etc/diag-run")


def test_a_new_or_empty_dir_is_marked_and_taken_again_and_cleared(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for run_dir in (empty, tmp_path / "new"):
        first = diag("launch", "--run-dir", str(run_dir), "--", "true")
        assert first.returncode == 0, first.stderr
        marker = json.loads((run_dir / claim.MARKER_FILE).read_text())
        assert marker["written_by"] == claim.MARKER_IDENTITY
        (run_dir / "stacks-9.json").write_text("{}")      # as an earlier run's dump
        (run_dir / "judged.json.part").write_text("{}")   # as a launcher killed mid-write
        (run_dir / "notes.txt").write_text("the user's own")
        again = diag("launch", "--run-dir", str(run_dir), "--", "true")
        assert again.returncode == 0, again.stderr
        assert not (run_dir / "stacks-9.json").exists()
        assert not (run_dir / "judged.json.part").exists()
        assert (run_dir / "notes.txt").read_text() == "the user's own"


def test_a_forged_or_foreign_marker_is_no_marker(tmp_path):
    run_dir = tmp_path / "forged"
    run_dir.mkdir()
    (run_dir / claim.MARKER_FILE).write_text('{"written_by": "someone else"}')
    (run_dir / "report.json").write_text("theirs")
    refused(diag("launch", "--run-dir", str(run_dir), "--", "true"),
            "holds files that diag did not write")
    assert (run_dir / "report.json").read_text() == "theirs"


def test_in_a_run_dir_of_diags_a_directory_by_a_file_name_of_diags_is_refused(tmp_path):
    run_dir = tmp_path / "run"
    assert diag("launch", "--run-dir", str(run_dir), "--", "true").returncode == 0
    (run_dir / "report.json").unlink()
    (run_dir / "report.json").mkdir()
    (run_dir / "3.probe").write_text("left")
    refused(diag("launch", "--run-dir", str(run_dir), "--", "true"),
            "report.json is not a file diag wrote")
    assert (run_dir / "3.probe").read_text() == "left"


def test_a_dump_never_overwrites_a_file_of_the_same_name(tmp_path, monkeypatch):
    monkeypatch.setattr(dump.time, "strftime", lambda _: "20250101-120000")
    (tmp_path / "dump-20250101-120000.json").write_text("theirs")
    body = dump.dump_run(str(tmp_path))
    assert body["path"] == str(tmp_path / "dump-20250101-120000-1.json")
    assert (tmp_path / "dump-20250101-120000.json").read_text() == "theirs"
