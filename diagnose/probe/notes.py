"""Notes from inside the job for the run's report: what the probe could not do
in a program we did not write (a hook its release lacks, a callback that
failed). Any process of the job appends a line to `notes.jsonl` in the run
dir; the collector reads the file, and each text is said once however many
processes made it."""
from __future__ import annotations

import json
import os

from diagnose import probe
from diagnose.core.files import read_small
from diagnose.core.schema import Document, read_version, stamped

NOTES_FILE = str(Document.NOTE)
NOTE_CHARS = 400                # one note, as written
FILE_BYTES = 1 << 20            # what a reader takes of the file


def note(text: str) -> None:
    """Append a note for the run's report; nothing without a run dir. Never raises."""
    run_dir = os.environ.get(probe.RUN_DIR_VAR)
    if not run_dir:
        return
    line = json.dumps(stamped(Document.NOTE, {"note": text[:NOTE_CHARS], "pid": os.getpid()}))
    try:
        with open(os.path.join(run_dir, NOTES_FILE), "a") as sink:
            sink.write(line + "\n")
    except OSError:
        pass                    # the run dir is the launcher's: a note it misses is all


def read(run_dir: str) -> list[str]:
    """The notes of the run, in the order first made, each once."""
    try:
        data = read_small(os.path.join(run_dir, NOTES_FILE), FILE_BYTES)
    except FileNotFoundError:
        return []
    except OSError as error:
        return [f"{NOTES_FILE}: {error.strerror}"]
    found: dict[str, None] = {}
    for line in data.decode(errors="replace").splitlines():
        try:
            text = read_version(Document.NOTE, json.loads(line))["note"]
        except (ValueError, KeyError, TypeError, RecursionError):
            continue
        if isinstance(text, str):
            found.setdefault(text[:NOTE_CHARS], None)
    return list(found)
