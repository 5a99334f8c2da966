"""diag logs for people (one screen: which rank, and why) and for programs (JSON).

    FIRST  Worker_PP1_TP0 (rank 2, PP stage 1, TP 0): AssertionError at ...
           12-01 05:29:58  vllm.log:46
      then 12-01 05:29:58  EngineCore: fatal error: RuntimeError: Worker failed ...
      then                 HTTP 500 for POST /v1/completions
      what it means: ...
    ALSO   ...
    NOTE   ...
"""
from __future__ import annotations

import os
from dataclasses import asdict

from rich.console import Console
from rich.text import Text

from diagnose.core.shown import shown
from diagnose.offline.console import output_console
from diagnose.offline.logs.model import Finding, Severity

MAX_LINKS = 12           # links of a chain shown; the JSON has them all
STYLES = {Severity.FAILURE: "bold red", Severity.HANG: "bold magenta",
          Severity.WARNING: "yellow", Severity.NOTE: "dim"}


def to_json(findings: list[Finding]) -> list[dict]:
    return [asdict(finding) for finding in findings]


def render(findings: list[Finding], files: list[str], dropped: int = 0,
           console: Console | None = None) -> None:
    console = console or output_console(highlight=False)
    names = ", ".join(shown(os.path.basename(path)) for path in files)
    console.print(Text(f"diag logs: {names}", style="bold"))
    if not any(finding.severity != Severity.NOTE for finding in findings):
        console.print(Text("no failure found", style="green"))
    for index, finding in enumerate(findings):
        label = ("FIRST" if index == 0 and finding.severity != Severity.NOTE
                 else finding.severity.value.upper() if finding.severity == Severity.NOTE
                 else "ALSO")
        console.print(_headline(label, finding))
        console.print(Text(f"       {_when(finding)}{_where(finding)}", style="dim"))
        for link in finding.chain[:MAX_LINKS]:
            line = Text("  then ", style="dim")
            line.append(f"{_when(link):<16}", style="dim")
            line.append(_counted(link))
            console.print(line)
        if len(finding.chain) > MAX_LINKS:
            console.print(Text(f"  … {len(finding.chain) - MAX_LINKS} more (see --json)",
                               style="dim"))
        if finding.advice:
            console.print(Text(f"  {shown(finding.advice)}", style="italic"))
    if dropped:
        console.print(Text(f"({dropped} further events not kept: more than the distinct "
                           f"findings diag logs holds)", style="dim"))


def _headline(label: str, finding: Finding) -> Text:
    line = Text(f"{label:<6} ", style=STYLES[finding.severity])
    line.append(_counted(finding), style="bold" if label == "FIRST" else "")
    return line


def _counted(finding: Finding) -> str:
    if finding.count <= 1:
        return shown(finding.summary)
    span = (f", {finding.first} to {finding.last}" if finding.first and finding.last
            and finding.first != finding.last else "")
    return shown(f"{finding.summary} [{finding.count} times{span}]")


def _when(finding: Finding) -> str:
    return shown(finding.first or "")


def _where(finding: Finding) -> str:
    if not finding.path:
        return ""
    return f"  {shown(os.path.basename(finding.path))}:{finding.line}"
