"""Who gets in at the listening end of diagnose/core/link.py's links: the
engine's head and diag's. Every connection's handshake runs on a thread of its
own under a short deadline (the link's), so that idle or slow connections
cannot hold up a real peer; a Gate caps how many are under way, from one host
and from all, and writes refusals as at most one line per interval.
"""
from __future__ import annotations

import socket
import sys
import threading
import time
from typing import Any, Callable

from diagnose.core.link import Codec, HandshakeError, Limits, Link


class Gate:
    """Who may be in a handshake with a listening end, under a flood. At most
    `per_source` connections of one host at once: a new one from a host at its
    cap ends that host's oldest handshake, so idle connections can delay a
    real peer from the same host by no more than its own handshake, never lock
    it out. Refusals are written as at most one line per `interval` seconds,
    the next line counting those left out in between."""

    def __init__(self, write: Callable[[str], None], per_source: int = 16, total: int = 64,
                 interval: float = 1.0):
        self.write, self.per_source, self.total = write, per_source, total
        self.interval = interval
        self.lock = threading.Lock()
        self.pending: dict[str, list[Link]] = {}
        self.count = 0                  # handshakes under way, every host's
        self.last_line, self.left_out = -interval, 0

    def admit(self, link: Link, peer: tuple) -> bool:
        """Counts `link` in its host's handshakes, ending the oldest if over the
        cap; False (nothing counted) when `total` handshakes are under way."""
        with self.lock:
            if self.count >= self.total:
                return False
            self.count += 1
            mine = self.pending.setdefault(peer[0], [])
            mine.append(link)
            oldest = mine.pop(0) if len(mine) > self.per_source else None
        if oldest is not None:
            oldest.shutdown()
        return True

    def release(self, link: Link, peer: tuple) -> None:
        """The handshake of `link` ended, either way."""
        with self.lock:
            self.count -= 1
            mine = self.pending.get(peer[0], [])
            if link in mine:
                mine.remove(link)
            if not mine:
                self.pending.pop(peer[0], None)

    def refuse(self, line: str) -> None:
        with self.lock:
            now = time.monotonic()
            if now - self.last_line < self.interval:
                self.left_out += 1
                return
            more = f" (and {self.left_out} more refused in the last {now - self.last_line:.0f} s)" \
                if self.left_out else ""
            self.last_line, self.left_out = now, 0
        self.write(line + more)


def write_line(line: str) -> None:
    """One write per line: links are refused on threads of their own, and print's two
    writes (the text, then the newline) from two of them ran lines together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


class Listener:
    """Accepts connections on `server` until close(). Each one the Gate admits gets
    a thread that authenticates it (this end checks the peer's proof first) and
    hands the proven link to `admit(link, peer)`, still under the handshake's
    deadline and counted by the Gate; unless that returns None, its result goes
    to `serve(link, peer, result)` on the same thread, the Gate's count released.
    Any other connection is closed, with a refusal line that starts with
    `refused` and names the peer and the reason."""

    def __init__(self, server: socket.socket, key: bytes, codec: Codec, limits: Limits,
                 admit: Callable[[Link, tuple], Any], refused: str, token_var: str,
                 serve: Callable[[Link, tuple, Any], None] | None = None,
                 write: Callable[[str], None] = write_line, total: int = 64):
        self.server, self.key, self.codec, self.limits = server, key, codec, limits
        self.admit, self.serve = admit, serve
        self.refused, self.token_var, self.total = refused, token_var, total
        self.gate = Gate(write, total=total)
        self.closed = False
        threading.Thread(target=self._accept, daemon=True, name="link-listener").start()

    def close(self) -> None:
        """No more connections; handshakes under way end unanswered."""
        self.closed = True
        self.server.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.server.accept()
            except OSError:            # closed
                return
            link = Link(conn, self.codec, self.limits)
            if self.gate.admit(link, peer):
                threading.Thread(target=self._handshake, args=(link, peer), daemon=True).start()
            else:
                link.close()
                self._refuse(peer, f"{self.total} connections are in their handshake already")

    def _handshake(self, link: Link, peer: tuple) -> None:
        try:
            admitted = self._admitted(link, peer)
        finally:
            self.gate.release(link, peer)
        if admitted is not None and self.serve is not None:
            self.serve(link, peer, admitted)

    def _admitted(self, link: Link, peer: tuple) -> Any:
        try:
            link.authenticate(self.key, challenge_first=True)
            if self.closed:
                link.close()
                return None
            return self.admit(link, peer)
        except HandshakeError as error:
            self._refuse(peer, f"wrong {self.token_var}" if error.wrong_key else str(error))
        except (OSError, EOFError, TypeError, ValueError) as error:
            link.close()
            self._refuse(peer, str(error))
        return None

    def _refuse(self, peer: tuple, reason: str) -> None:
        self.gate.refuse(f"{self.refused} from {peer[0]}:{peer[1]}: {reason}")
