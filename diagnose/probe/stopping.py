"""Inside the job's command: it begins to stop the job itself (vLLM's API server
shuts its engine down, on SIGINT or at its end). One file, stopping.json, says
when, before any process is ended: the analysis then reads the deaths that
follow as the stop they are, not as failures. The first stop counts."""
from __future__ import annotations

import json
import os
import time

from diagnose import probe
from diagnose.core.schema import Document, stamped

STOPPING_FILE = str(Document.STOPPING)


def began() -> None:
    """Say that the command begins to stop the job; nothing without a run dir, or
    once said. Written beside, then linked: a reader sees all of it or none, and
    a second stop never replaces the first. Never raises."""
    run_dir = os.environ.get(probe.RUN_DIR_VAR)
    if not run_dir:
        return
    path = os.path.join(run_dir, STOPPING_FILE)
    tmp = os.path.join(run_dir, f".{STOPPING_FILE}.{os.getpid()}.tmp")
    body = stamped(Document.STOPPING, {"at": time.time(), "pid": os.getpid()})
    try:
        with open(tmp, "w") as out:
            json.dump(body, out)
        os.link(tmp, path)
    except OSError:
        pass                     # said before, or the run dir is gone: nothing to add
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
