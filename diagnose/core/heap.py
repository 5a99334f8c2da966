"""The cyclic GC, paused around work that makes millions of objects without
reference cycles: the records of thousands of ranks, the analysis's indexes."""
from __future__ import annotations

import gc
from contextlib import contextmanager


@contextmanager
def gc_paused():
    """While such objects are made, the cyclic GC would only scan the growing
    heap again and again (two thirds of the time of reading 128 Flight Recorder
    dumps of 2000 entries, a quarter to a third of the analysis of 16,384
    dumps); once made, it would walk them three times more as they age through
    its generations (3.6 s after reading 1024 dumps). So it is paused, and what
    lives then is frozen out of its reach (gc.freeze: still freed when no
    longer referenced). Nested, the inner one only freezes."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
