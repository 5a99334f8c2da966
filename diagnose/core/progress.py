"""Progress of long work, on stderr: a rich bar while it runs when stderr is a terminal,
and, where the work asks for it, one line when it ends (then the only output when stderr
is not a terminal). The engine's start-up (weights, CUDA graphs) and diag's long reads
(Flight Recorder dumps by the thousand, logs of gigabytes) both report through it.

Standard library at import: rich, a base dependency, is imported only once a bar is
drawn, so the probe, which imports core, never loads it.

The ranks of a job share one terminal and do the same work at the same time, so only
one process reports: rank 0 of torch.distributed (its lines say so), or a process
outside it.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from typing import TypeVar

T = TypeVar("T")
Advance = Callable[[float, str], None]   # (units done since the last call, detail to show)


def quiet(done: float, detail: str) -> None:
    """The Advance of work too small for a bar."""


def _prefix() -> str | None:
    """What this process's progress lines begin with; None: another process reports."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return ""
    return "[rank 0] " if dist.get_rank() == 0 else None


def track(items: Iterable[T], doing: str, unit: str, detail: Callable[[T], str] = str,
          summary: bool = True) -> Iterator[T]:
    """The items, each counted done when the loop comes back for the next; the bar shows
    detail(item) of the last one. With summary, when all are done:
    `{doing}: {n} {unit} in S s`."""
    items = list(items)
    with bar(doing, len(items), unit, summary) as advance:
        for item in items:
            yield item
            advance(1, detail(item))


@contextmanager
def bar(doing: str, total: int, unit: str, summary: bool = True) -> Iterator[Advance]:
    """A bar of `total` units for the block, advanced by the function it yields; the
    summary line is printed only when the block ends without an exception."""
    prefix = _prefix()
    if prefix is None:
        yield quiet
        return
    doing = prefix + doing
    started = time.monotonic()
    drawn = _drawn(doing, total) if sys.stderr.isatty() else nullcontext(quiet)
    with drawn as advance:
        yield advance
    if summary:
        print(f"{doing}: {total} {unit} in {time.monotonic() - started:.1f} s", file=sys.stderr,
              flush=True)


@contextmanager
def _drawn(doing: str, total: int) -> Iterator[Advance]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[detail]}"))
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(doing, total=total, detail="")
        yield lambda done, text: progress.update(task, advance=done, detail=text)
