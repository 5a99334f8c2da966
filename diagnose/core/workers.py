"""Worker processes for reads one interpreter is too slow for (Flight Recorder
dumps, a head's node files, its nodes' large reports): each worker reads and
checks its input and sends back plain data it made itself, pickled; the caller
loads it with an unpickler that refuses every global, so nothing a file or a
peer sent ever names code to run."""
from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
from collections.abc import Iterator
from contextlib import contextmanager


class PlainUnpickler(pickle.Unpickler):
    """Lists, dicts, tuples, text and numbers only: `what` says what was read."""

    def __init__(self, source, what: str = "data from a worker"):
        super().__init__(source)
        self.what = what

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}: {self.what} holds "
                                     f"plain data only")


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:               # no sched_getaffinity (macOS)
        return os.cpu_count() or 1


@contextmanager
def pool(workers: int) -> Iterator[multiprocessing.pool.Pool | None]:
    """A pool of `workers` processes (`started`) that ends with the block, or
    None for one: then the caller reads in this process."""
    started = start(workers)
    if started is None:
        yield None
        return
    with started:
        yield started


def start(workers: int) -> multiprocessing.pool.Pool | None:
    """A pool of `workers` processes, or None for fewer than two; its owner
    terminates it. Forked where the platform can: the workers start in
    milliseconds with this process's modules already imported, and no module
    runs again (a spawned worker runs the caller's main script again, where
    that script does not guard it). A worker only reads and checks what it is
    given and sends back what it made; it takes none of the locks the caller's
    other threads (the TUI's, the head's links) may hold."""
    if workers < 2:
        return None
    methods = multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if "fork" in methods else None)
    return context.Pool(workers, initializer=_ended_by_sigterm)


def _ended_by_sigterm() -> None:
    """In a worker: SIGTERM and SIGHUP end it as the kernel ends a process. The
    pool is closed by holding its task queue's lock and sending each worker
    SIGTERM; the handler a worker inherits from diag's CLI (it raises
    SystemExit) can miss a signal that comes as the worker blocks on that lock,
    and the close then waits for it forever (seen: 1 run of 13 at 4,096 dumps)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


def sent(value: object) -> bytes:
    """In a worker: what it sends back."""
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
