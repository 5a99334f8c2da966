"""Escape sequences planted in what diag reads (a probe file's frame and phase,
a log line, a Flight Recorder dump's group and frames) never reach the
terminal raw: `diag analyze`, `diag logs` and the TUI show them escaped."""
import os
import pickle
import time

import pexpect
import pyte
import pytest

from diagnose.core.shown import shown
from diagnose.core.snapshot import Span, Verdict
from diagnose.core.vocab import Mention
from diagnose.offline import synth
from diagnose.offline.report import summary_text
from helpers.run import DIAG, REPO, diag

pytestmark = pytest.mark.e2e

FR_HANG = os.path.join(REPO, "tests", "fixtures", "fr_hang")
# Clear the screen, retitle the window, print fake green text, overwrite the
# line, reverse what follows.
EVIL = "\x1b[2J\x1b]0;pwned\x07\x1b[32mEverything is fine\x1b[0m\r\u202e"
RAW = ["\x1b[2J", "\x1b]0;pwned", "\x1b[32mEverything", "\r\u202e", "\u202e"]


def assert_none_raw(output: str) -> None:
    for sequence in RAW:
        assert sequence not in output, (sequence, output[-3000:])
    assert "\\x1b]0;pwned" in output              # shown, escaped


def probe_run_dir(path: str) -> None:
    """A hung job whose culprit's frame and open phase carry EVIL."""
    job = synth.hung_job(8, 2, 6, "stuck_in_phase")
    culprit = job.ranks[6]
    culprit.frame = "engine/layers.py:190 forward" + EVIL
    culprit.open_phases[-1].name = "f" + EVIL      # the file keeps the first bytes of a name
    synth.write_run_dir(job.snapshot(), path)


def fr_dumps(path: str) -> None:
    """fr_hang's real dumps, their group names and frames carrying EVIL."""
    os.makedirs(path)
    for name in os.listdir(FR_HANG):
        with open(os.path.join(FR_HANG, name), "rb") as source:
            dump = pickle.load(source)      # the repository's own fixture
        for entry in dump["entries"]:
            pg_name, desc = entry["process_group"]
            entry["process_group"] = (pg_name, desc + EVIL)
            for frame in entry["frames"]:
                frame["name"] += EVIL
        with open(os.path.join(path, name), "wb") as sink:
            pickle.dump(dump, sink)


def log_file(path: str) -> None:
    with open(path, "w") as sink:
        sink.write("INFO starting\nTraceback (most recent call last):\n"
                   '  File "x.py", line 3, in <module>\n    boom()\n'
                   f"RuntimeError: boom {EVIL}\n")


def on_a_terminal(*argv, until: str) -> tuple[str, pyte.Screen]:
    """`diag ARGV` on a pseudo-terminal: everything it wrote, and the screen it
    left, once `until` shows (then q)."""
    screen = pyte.Screen(160, 48)
    stream = pyte.Stream(screen)
    child = pexpect.spawn(DIAG[0], [*DIAG[1:], *map(str, argv)], cwd=REPO,
                          dimensions=(48, 160), env=dict(os.environ, TERM="xterm-256color"),
                          encoding="utf-8", codec_errors="replace", timeout=60)
    written = []
    deadline = time.monotonic() + 60
    try:
        while until not in "\n".join(screen.display):
            assert time.monotonic() < deadline, "\n".join(screen.display)
            try:
                chunk = child.read_nonblocking(65536, timeout=1)
            except pexpect.TIMEOUT:
                continue
            written.append(chunk)
            stream.feed(chunk)
        child.send("q")
        child.expect(pexpect.EOF)
        written.append(child.before or "")
    finally:
        child.close(force=True)
    return "".join(written), screen


def test_the_sanitiser_escapes_controls_and_invisible_formatting_and_keeps_the_rest():
    assert shown("a\x1b[2Jb\r\u202ec\x9bd") == "a\\x1b[2Jb\\x0d\\u202ec\\x9bd"
    assert shown("rank 3 — état 中\tx") == "rank 3 — état 中\\x09x"
    assert shown("line\n\tnext\x07", lines=True) == "line\n\tnext\\x07"


def test_a_summary_keeps_its_styles_on_their_words_once_escaped():
    summary = f"rank 6 at f{EVIL} waits; rank 7 waits"
    start = summary.index("rank 7")
    verdict = Verdict(kind="stuck_in_phase", culprit_ranks=[6], victim_ranks=[7],
                      summary=summary, spans=[Span(0, 6, Mention.CULPRIT),
                                              Span(start, start + 6, Mention.VICTIMS)])
    text = summary_text(verdict, {Mention.CULPRIT: "red", Mention.VICTIMS: "yellow"})
    assert text.plain == shown(summary)
    styled = {text.plain[span.start:span.end]: str(span.style) for span in text.spans}
    assert styled == {"rank 6": "red", "rank 7": "yellow"}


def test_analyze_shows_a_probe_files_escapes_escaped(tmp_path):
    probe_run_dir(str(tmp_path / "run"))
    done = diag("analyze", tmp_path / "run")
    assert done.returncode == 1, done.stderr
    assert "stuck_in_phase" in done.stdout
    assert_none_raw(done.stdout + done.stderr)
    output, screen = on_a_terminal("analyze", tmp_path / "run", until="stuck_in_phase")
    assert_none_raw(output)
    assert screen.title != "pwned" and "Everything is fine" not in screen.display[0]


def test_analyze_shows_a_flight_recorder_dumps_escapes_escaped(tmp_path):
    fr_dumps(str(tmp_path / "fr"))
    done = diag("analyze", tmp_path / "fr")
    assert done.returncode == 1, done.stderr
    assert "rank 3 never joined tp1\\x1b" in done.stdout
    assert_none_raw(done.stdout + done.stderr)


def test_logs_shows_a_log_lines_escapes_escaped(tmp_path):
    log_file(str(tmp_path / "job.log"))
    done = diag("logs", tmp_path / "job.log")
    assert done.returncode == 1, done.stderr
    assert_none_raw(done.stdout + done.stderr)


@pytest.mark.parametrize("source", ["probe", "fr"])
def test_the_tui_shows_them_escaped(tmp_path, source):
    path = tmp_path / source
    (probe_run_dir if source == "probe" else fr_dumps)(str(path))
    output, screen = on_a_terminal("tui", path, until="\\x1b")
    assert_none_raw(output)
    assert screen.title != "pwned"
