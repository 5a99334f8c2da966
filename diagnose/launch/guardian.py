"""The guardian: a small process that ends the job once its launcher is gone,
however the launcher ended (SIGKILL included).

The launcher starts it first, in a session of its own (so no signal meant for
the launcher's terminal or the command's group reaches it), and keeps the
write end of a pipe to it; nothing else holds that end. The launcher writes
the command's pid (its session) each time it starts the command. When the pipe
reaches EOF, the launcher is gone or done: the guardian ends whatever is left
of the job (job.end_job: SIGTERM, a grace, SIGKILL) and exits. It also holds
the run dir's lock, so that no new launch takes the run dir while the old
job's processes may still write to it.

PR_SET_PDEATHSIG on the command alone is not enough: it reaches only the
launcher's direct child, and `sh -c 'python -m engine ...; echo done'` leaves
the engine and its workers running when sh dies.
"""
from __future__ import annotations

import os
import subprocess
import sys

from diagnose.launch.job import end_job

GRACE_S = 5.0
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Guardian:
    """The launcher's side: start(), watch(pid) for every start of the command,
    release() once the launcher has ended the job itself."""

    def __init__(self, run_dir: str, lock_fd: int):
        read_end, self.pipe = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")])))
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "diagnose.launch.guardian", os.path.abspath(run_dir)],
                stdin=read_end, stdout=subprocess.DEVNULL, pass_fds=(lock_fd,), env=env,
                start_new_session=True)
        finally:
            os.close(read_end)

    def watch(self, pid: int) -> None:
        os.write(self.pipe, f"{pid}\n".encode())

    def release(self) -> None:
        """The launcher ended the job: the guardian checks that nothing is left, and exits."""
        os.close(self.pipe)
        self.proc.wait()


def main(run_dir: str) -> None:
    session = None
    for line in sys.stdin:          # until EOF: the launcher is gone or done
        session = int(line)
    if session is not None:
        end_job(session, run_dir, GRACE_S)


if __name__ == "__main__":
    main(sys.argv[1])
