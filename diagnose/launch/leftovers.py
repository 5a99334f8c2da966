"""Shared memory a job leaves behind. Serving engines keep their broadcast rings
and locks in /dev/shm (vLLM's psm_* rings and sem.mp-* locks, hundreds of MB);
a job that is killed can leave them there for good. While the job runs, the
launcher notes which /dev/shm files its processes map or hold open; once the
job is over, it removes those that are left and that no other process holds.

Files are known by inode, not name: a semaphore is created under a temporary
name that is gone by the time it is mapped under its final one."""
from __future__ import annotations

import os

import psutil

SHM_DIR = "/dev/shm"


class SharedMemoryTracker:
    def __init__(self):
        self.inodes: set[int] = set()

    def sample(self, pids: list[int]) -> None:
        """Note the /dev/shm files these processes map or have open now."""
        for pid in pids:
            self.inodes |= shm_inodes(pid)

    def remove_leftovers(self) -> list[str]:
        """Remove the noted files that still exist and that no process holds;
        the names removed."""
        left = {inode: name for inode, name in _shm_files().items() if inode in self.inodes}
        if not left:
            return []
        held = set()
        for pid in psutil.pids():
            held |= shm_inodes(pid)
        removed = []
        for inode, name in sorted(left.items(), key=lambda item: item[1]):
            if inode in held:
                continue
            try:
                os.remove(os.path.join(SHM_DIR, name))
                removed.append(name)
            except OSError:
                continue
        return removed


def shm_inodes(pid: int) -> set[int]:
    """Inodes of the /dev/shm files the process maps or has open."""
    inodes = set()
    try:
        with open(f"/proc/{pid}/maps") as maps:
            for line in maps:
                fields = line.split(maxsplit=5)
                if len(fields) == 6 and fields[5].startswith(SHM_DIR + "/"):
                    inodes.add(int(fields[4]))
        for fd in os.listdir(f"/proc/{pid}/fd"):
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
            if target.startswith(SHM_DIR + "/"):
                inodes.add(os.stat(f"/proc/{pid}/fd/{fd}").st_ino)
    except (OSError, ValueError):
        pass                      # gone, or not ours to read
    return inodes


def _shm_files() -> dict[int, str]:
    try:
        with os.scandir(SHM_DIR) as entries:
            return {entry.inode(): entry.name for entry in entries if entry.is_file()}
    except OSError:
        return {}
