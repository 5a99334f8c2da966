"""diag logs: read serving and training logs as a story, not as lines.

The lines are grouped by the process that printed them (vLLM's "(Worker_TP1
pid=...)", torchrun's "[rank3]:", NCCL's "host:pid:tid [dev]"), each
process's Python tracebacks are rebuilt, and what they say is ordered in time.
The answer names the first failure and where it happened (process, rank,
exception, the innermost frame of the program's own code), with the chain
that followed from it; then the other findings. A warning printed N times is
one finding with a count and its first and last time.

    reader.py       is it text; one line at a time; the prefixes taken apart
    processes.py    who printed what: processes, vLLM ranks, TP / PP sizes
    tracebacks.py   Python tracebacks, one per process, bounded
    rules.py        what one line or one traceback tells
    collectives.py  NCCL watchdog, desync reports, gloo timeouts: per rank
    prefilter.py    which lines of a chunk can matter, found with bytes.find
    scan.py         the pass over the files, in bounded memory
    story.py        the first failure, its chain, the other findings
    behind.py       the rank the others wait for in a collective
    hang.py         vLLM's broadcast warning and execute_model timeout
    words.py        the sentences
    render.py       one screen for people, JSON for programs
"""
from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass, field

from diagnose.core import progress

from diagnose.offline.logs.model import Finding, Kind, Severity
from diagnose.offline.logs.reader import LogReadError, chunks, open_text
from diagnose.offline.logs.render import render, to_json
from diagnose.offline.logs.scan import Scanner
from diagnose.offline.logs.story import tell

MB = 1 << 20
BAR_FROM_MB = 32          # smaller logs take under a second or two

__all__ = ["Finding", "Kind", "LogReadError", "Report", "Severity", "render", "scan_file",
           "scan_files", "to_json"]


@dataclass
class Report:
    findings: list[Finding]
    files: list[str]                              # the files read
    errors: list[str] = field(default_factory=list)   # one line for each file that was not
    dropped: int = 0                              # events beyond what diag logs keeps

    @property
    def faults(self) -> bool:
        """A finding that is more than a note."""
        return any(finding.severity != Severity.NOTE for finding in self.findings)


def scan_files(paths: list[str]) -> Report:
    """Every readable file of paths, read as one story (ranks' logs may be split
    over several files); the others are named in errors."""
    scanner, errors = Scanner(), []
    megabytes = _megabytes(paths)
    with (progress.bar("reading logs", megabytes, "MB", summary=False)
          if megabytes >= BAR_FROM_MB else nullcontext(progress.quiet)) as advance:
        for path in paths:
            try:
                source = open_text(path)
            except LogReadError as error:
                errors.append(str(error))
                continue
            with source:
                try:
                    scanner.scan(path, _counted(chunks(source), source, path, advance))
                except OSError as error:
                    errors.append(f"{path}: {(error.strerror or str(error)).lower()}")
    findings = tell(scanner) if scanner.files else []
    return Report(findings, scanner.files, errors, scanner.dropped)


def _megabytes(paths: list[str]) -> int:
    sizes = []
    for path in paths:
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            pass                           # named in the report's errors when it is read
    return round(sum(sizes) / MB)


def _counted(chunks, source, path: str, advance):
    """The chunks, the bar advanced by the megabytes read after each."""
    counted = 0
    for lines in chunks:
        yield lines
        read = source.tell()
        advance((read - counted) / MB, os.path.basename(path))
        counted = read


def scan_file(path: str) -> list[Finding]:
    """The findings of one file; LogReadError if it cannot be read as a log."""
    open_text(path).close()
    report = scan_files([path])
    if report.errors:
        raise LogReadError(report.errors[0])
    return report.findings
