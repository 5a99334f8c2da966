"""How a launched job ended, in diag's words and codes: diag launch's own exit
code for the verdicts, how the command ended (exit.json), the line diag writes
into the job's output where it ends the job, and the key that makes a verdict
the same one poll after poll."""
from __future__ import annotations

from diagnose.cli.common import EXIT_CRASHED, EXIT_HEALTHY, EXIT_VERDICTS
from diagnose.core.snapshot import Verdict
from diagnose.core.vocab import HANG_KINDS, VerdictKind

ENDED_MARK = "--- diag ended the job here"   # how diag's line in the output starts


def ending_line(stopped_by: str, verdicts: list[Verdict], on_hang: str = "kill") -> str:
    """diag's line in the job's output where it ends the job: the lines after it are
    the job being stopped (a torchrun agent's SignalException, say), not its failure."""
    hangs = [verdict for verdict in verdicts if verdict.kind in HANG_KINDS]
    if stopped_by == "hang" and hangs:
        culprits = ", ".join(map(str, hangs[0].culprit_ranks)) or "none named"
        why = f"--on-hang {on_hang}: {hangs[0].kind}, culprit rank {culprits}"
    else:
        why = f"stopped by {stopped_by}"
    return f"{ENDED_MARK} ({why}) ---"


def judged_exit(verdicts: list[Verdict], command_code: int | None,
                crashed: bool = False) -> int:
    """diag launch's own code for a job judged at its end (command_code: the
    command's, as a shell gives it; None when diag ended a hung job). A hang is
    a verdict; with none, a rank's death, an exception a rank raised in a job
    that then ended by itself (crashed: analysis.crash found its first failure,
    whatever the command's code) or the command's failure is a crash."""
    failures = {VerdictKind.DEAD} | ({VerdictKind.RAISED} if command_code is not None else set())
    if any(v.kind in HANG_KINDS and v.kind not in failures for v in verdicts):
        return EXIT_VERDICTS
    if command_code not in (0, None) or crashed or any(v.kind in failures for v in verdicts):
        return EXIT_CRASHED
    return EXIT_VERDICTS if verdicts else EXIT_HEALTHY


def command_ending(returncode: int, stopped_by: str | None) -> dict:
    """How the command ended, for exit.json and the report: its exit code when
    it ended by itself; when diag stopped it, no exit code of its own, and the
    code it returned once stopped beside why."""
    if stopped_by is None:
        return {"command_exit": returncode, "stopped_by": None}
    return {"command_exit": None, "exit_after_stop": returncode, "stopped_by": stopped_by}


def verdict_key(verdict: Verdict) -> tuple:
    """One verdict however long it lasts: its summary's "for N s" grows, this does not."""
    return verdict.kind, tuple(verdict.culprit_ranks)
