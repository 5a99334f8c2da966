"""Progress of long start-up work, on stderr: a rich bar while it runs when stderr is a
terminal, and one line when it ends (the only output when stderr is not a terminal).

The ranks of a job share one terminal and do the same work at the same time, so
only one process reports: rank 0 of torch.distributed (its lines say so), or a
process outside it.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import TypeVar

T = TypeVar("T")


def _prefix() -> str | None:
    """What this process's progress lines begin with; None: another process reports."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_initialized():
        return ""
    return "[rank 0] " if dist.get_rank() == 0 else None


def track(items: Sequence[T], doing: str, unit: str,
          detail: Callable[[T], str] = str) -> Iterator[T]:
    """The items, each counted done when the loop comes back for the next; the bar shows
    detail(item) of the last one. When all are done: `{doing}: {n} {unit} in S s`."""
    prefix = _prefix()
    if prefix is None:
        yield from items
        return
    doing = prefix + doing
    started = time.monotonic()
    bar = _bar(doing, len(items)) if sys.stderr.isatty() else nullcontext(lambda text: None)
    with bar as advance:
        for item in items:
            yield item
            advance(detail(item))
    print(f"{doing}: {len(items)} {unit} in {time.monotonic() - started:.1f} s", file=sys.stderr,
          flush=True)


@contextmanager
def _bar(doing: str, total: int) -> Iterator[Callable[[str], None]]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(bar_width=24), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[detail]}"))
    with Progress(*columns, console=Console(file=sys.stderr), transient=True) as progress:
        task = progress.add_task(doing, total=total, detail="")
        yield lambda text: progress.update(task, advance=1, detail=text)
