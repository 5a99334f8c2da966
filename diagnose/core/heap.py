"""The cyclic GC, tuned for diag's own processes, which hold the states of
thousands of ranks, and paused around work that makes millions of objects
without reference cycles: the records of thousands of ranks, the analysis's
indexes."""
from __future__ import annotations

import gc
from contextlib import contextmanager

YOUNG_OBJECTS = 100_000    # net new objects between young collections (Python's default: 700)
YOUNG_PER_MIDDLE = 20      # young collections per middle one (10)
MIDDLE_PER_FULL = 100      # middle ones before a full collection may run (10)


def tune_for_large_heaps() -> None:
    """Collect the young generation rarely, and the whole heap more rarely still.
    A head of 16,384 ranks holds millions of objects and replaces tens of
    thousands at each node's report; with Python's defaults most of those
    survive a young collection, age into the old generation, and soon set off a
    full collection, which walks the whole heap (about 5 s on a 2-core machine)
    and held the head about 2/3 of the time it spent applying reports
    (benchmarks/head_gc.py). Cyclic garbage, which is rare here, waits longer.
    Only diag's own processes call this: never a user's rank."""
    gc.set_threshold(YOUNG_OBJECTS, YOUNG_PER_MIDDLE, MIDDLE_PER_FULL)


@contextmanager
def gc_paused(freeze: bool = True):
    """While such objects are made, the cyclic GC would only scan the growing
    heap again and again (two thirds of the time of reading 128 Flight Recorder
    dumps of 2000 entries, a quarter to a third of the analysis of 16,384
    dumps, nearly half of a live head's analysis of 8,192 ranks under the
    thresholds above); once made, it would walk them three times more as they
    age through its generations (3.6 s after reading 1024 dumps). So it is
    paused, and with `freeze` what lives then is frozen out of its reach
    (gc.freeze: still freed when no longer referenced): for a process that ends
    soon after, as `diag analyze`. A long-running one (the head, the TUI) does
    not freeze: its later cyclic garbage would never be collected. Nested, the
    inner one only freezes, if asked to."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()
