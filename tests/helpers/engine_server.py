"""`python -m engine serve` as a real process on a free port: started until it
serves, asked over HTTP, and stopped by a signal it must end on by itself, leaving
no process or shared memory."""
from __future__ import annotations

import asyncio
import os
import re
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import IO

import aiohttp
import psutil

from helpers.live_log import text_so_far
from helpers.run import REPO

START_TIMEOUT_S = 120
MAX_MODEL_LEN = 256
SHORT = ("--max-model-len", str(MAX_MODEL_LEN))


@dataclass
class Server:
    proc: subprocess.Popen
    url: str
    model: str
    log: IO[bytes]

    def log_text(self) -> str:
        return text_so_far(self.log)

    def stderr(self) -> str:
        return self.log_text()[-4000:]

    def log_lines_once(self, pattern: re.Pattern, timeout_s: float = 10.0) -> list[str]:
        """The log's lines once one of them matches `pattern` in full, or at `timeout_s`.

        aiohttp writes a request's access line after the response has gone out, so a
        client that has its answer can read the log a moment before the line is there.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            lines = self.log_text().splitlines()
            if any(pattern.fullmatch(line) for line in lines) or time.monotonic() > deadline:
                return lines
            time.sleep(0.05)

    def descendants(self) -> list[psutil.Process]:
        return psutil.Process(self.proc.pid).children(recursive=True)


def start_server(model: str, *flags: str, host: str | None = "127.0.0.1") -> Server:
    """`python -m engine serve MODEL FLAGS` on any free port; host None: vLLM's default."""
    log = tempfile.TemporaryFile()
    cmd = [sys.executable, "-m", "engine", "serve", model, "--port", "0", *flags,
           *(["--host", host] if host else [])]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=log)
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    if not selector.select(timeout=START_TIMEOUT_S):
        proc.kill()
        raise AssertionError(f"server did not start within {START_TIMEOUT_S} s")
    line = proc.stdout.readline().decode()
    server = Server(proc, line.split(" on ")[-1].strip(), model, log)
    if not line.startswith("serving"):
        proc.wait(timeout=30)
        raise AssertionError(f"server failed to start: {line!r}\n{server.stderr()}")
    assert http_get(server, "/health") == (200, '{"status": "ok"}')
    return server


def stop_server(server: Server, sig: signal.Signals = signal.SIGTERM) -> None:
    """The server must exit by itself on `sig`, and leave no process or shared memory."""
    procs = [psutil.Process(server.proc.pid), *server.descendants()]
    shm = {m.path for p in procs for m in maps(p) if m.path.startswith("/dev/shm/")}
    server.proc.send_signal(sig)
    try:
        code = server.proc.wait(timeout=30)
    finally:
        _, alive = psutil.wait_procs(procs, timeout=10)
        for proc in alive:
            proc.kill()
    assert not alive, f"left behind: {alive}"
    assert code == 0, server.stderr()
    assert not [path for path in shm if os.path.exists(path)]
    server.proc.stdout.close()
    server.log.close()


def maps(proc: psutil.Process):
    try:
        return proc.memory_maps(grouped=False)
    except psutil.Error:
        return []


def http_get(server: Server, path: str) -> tuple[int, str]:
    async def get():
        async with aiohttp.ClientSession() as session, session.get(server.url + path) as r:
            return r.status, await r.text()
    return asyncio.run(get())
