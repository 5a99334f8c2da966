"""The version of every JSON document diag writes (docs/json.md describes each).

A writer stamps its body with `stamped`; a reader of diag's own files takes it
through `read_version`, which accepts every version up to the current one (a
file without the field is version 1, as diag wrote it before the field
existed) and refuses a newer one with one line. A version goes up when a
field changes meaning or goes away; a new field does not need one.
"""
from __future__ import annotations

import json

from diagnose.core.vocab import Name

FIELD = "schema_version"


class Document(Name):
    REPORT = "report.json"              # diag launch's report (and its -o copy)
    JUDGED = "judged.json"              # diag launch's latest verdicts, as they change
    EXIT = "exit.json"                  # how the command ended
    LAUNCH = "launch.json"              # what diag launch ran, with which options
    NODE = "node-N.json"                # a multi-node head's last report of node N
    STACKS = "stacks-R.json"            # a probe's stacks dump
    ERROR = "error-R.json"              # the first exception that left a phase
    STATE = "state-R.json"              # diag launch's last look at what a rank does
    MARK = "marks.jsonl"                # one line per armed --mark
    SNAPSHOT = "snapshot.json"          # diag attach: the snapshot it judged
    ATTACH = "attach.json"              # diag attach: the job it found and its samples
    NOTE = "notes.jsonl"                # one line per note a process of the job made
    STOPPING = "stopping.json"          # the command began to stop the job itself
    DUMP = "dump"                       # diag dump --json, and dump-<time>.json
    ANALYZE = "analyze"                 # diag analyze --json
    LOGS = "logs"                       # diag logs --json
    TRACE = "trace"                     # diag analyze --perfetto


# 2 for exit and report: command_exit is null when diag stopped the command
# (exit_after_stop holds what it returned then); 2 for node: a rank's list fields
# hold rows (each item's fields' values, in order), not objects
CURRENT = {document: 1 for document in Document} | {Document.EXIT: 2, Document.REPORT: 2,
                                                    Document.NODE: 2}


class NewerSchema(ValueError):
    """A file written by a newer diag, in a version this one does not read."""


def stamped(document: Document, body: dict) -> dict:
    """The body with its schema version first."""
    return {FIELD: CURRENT[document], **body}


def as_json(body: dict) -> str:
    """A document as diag writes it, indented, made in one call: json.dump writes
    each token with a call of its own (0.9 s for the 3 MB report of 16,384 ranks,
    against 0.14 s)."""
    return json.dumps(body, indent=1, default=str)


def read_version(document: Document, body: object) -> dict:
    """The body without its version field; NewerSchema for a version past the
    current one, ValueError for a body that is no object or a version that is
    no whole number. The messages leave the file's name to the caller."""
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    version = body.get(FIELD, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"{FIELD} {str(version)[:20]!r} is no version")
    if version > CURRENT[document]:
        raise NewerSchema(f"{FIELD} {version} is newer than this diag reads "
                          f"({CURRENT[document]}): upgrade hangscope to read it")
    return {key: value for key, value in body.items() if key != FIELD}
