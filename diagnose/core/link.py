"""An authenticated TCP link between two processes that share a secret: the
engine's node link and diag's between launchers.

Before anything else crosses, each end proves that it knows the secret with
the HMAC challenge-response of multiprocessing.connection (what its Listener
and Client run with an authkey), once in each direction, so the secret itself
never crosses the wire. Until both have, a message is at most HANDSHAKE_BYTES,
nothing is decoded, and every send and read must end by the handshake's
deadline. After it a message is at most `limits.max_bytes`, and each must be
sent, or arrive whole, within `limits.message_s`.

Messages are bytes behind a 4-byte length; a Codec turns objects into them and
back (the engine's links carry pickles, diag's JSON).
"""
from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from multiprocessing.connection import AuthenticationError, answer_challenge, deliver_challenge
from typing import Any, Callable

LENGTH = struct.Struct("!I")
HANDSHAKE_BYTES = 256      # a challenge or an answer is far smaller


class HandshakeError(Exception):
    """The peer did not complete the handshake; the message says why in a few words."""

    def __init__(self, reason: str, wrong_key: bool = False):
        super().__init__(reason)
        self.wrong_key = wrong_key


@dataclass(frozen=True)
class Limits:
    handshake_s: float = 5.0        # the whole handshake, from the link's creation
    message_s: float = 30.0         # one message once authenticated, from the call
    max_bytes: int = 256 << 20      # one message once authenticated


@dataclass(frozen=True)
class Codec:
    encode: Callable[[Any], bytes]
    decode: Callable[[bytes], Any]


class Link:
    """One end of a link. The owner calls authenticate() first, may exchange a
    few messages under the handshake's deadline, then calls settle()."""

    def __init__(self, sock: socket.socket, codec: Codec, limits: Limits,
                 handshake_s: float | None = None):
        self.sock, self.codec, self.limits = sock, codec, limits
        self.handshake_s = limits.handshake_s if handshake_s is None else handshake_s
        self.deadline: float | None = time.monotonic() + self.handshake_s
        self.authenticated = False

    def authenticate(self, key: bytes, challenge_first: bool) -> None:
        """Both ends prove they know `key`; the listening end challenges first.
        HandshakeError (the link closed) when the peer does not."""
        steps = ((deliver_challenge, answer_challenge) if challenge_first
                 else (answer_challenge, deliver_challenge))
        try:
            for step in steps:
                step(self, key)
        except AuthenticationError:
            self.close()
            raise HandshakeError("wrong key", wrong_key=True) from None
        except AssertionError:      # answer_challenge's check that a challenge came
            self.close()
            raise HandshakeError("the peer sent no challenge") from None
        except (EOFError, OSError) as error:
            self.close()
            raise HandshakeError(self._reason(error)) from None
        self.authenticated = True

    def settle(self) -> None:
        """The handshake is over: from now on each message has its own deadline."""
        self.deadline = None

    def send(self, message: Any) -> None:
        self._require_authenticated()
        self.send_bytes(self.codec.encode(message))

    def recv(self) -> Any:
        """The next message, decoded; EOFError when the peer closed the link,
        TimeoutError when it was too slow, OSError when the message is too long."""
        self._require_authenticated()
        return self.codec.decode(self.recv_bytes(self.limits.max_bytes))

    # What multiprocessing.connection's challenge-response needs of a connection.

    def send_bytes(self, data: bytes) -> None:
        self.sock.settimeout(self._left(self._message_deadline()))
        self.sock.sendall(LENGTH.pack(len(data)) + data)

    def recv_bytes(self, maxlength: int) -> bytes:
        if not self.authenticated:
            maxlength = min(maxlength, HANDSHAKE_BYTES)
        deadline = self._message_deadline()
        (length,) = LENGTH.unpack(self._read(LENGTH.size, deadline))
        if length > maxlength:
            raise OSError(f"a message of {length} bytes, over the {maxlength} allowed")
        return self._read(length, deadline)

    def fileno(self) -> int:
        """For multiprocessing.connection.wait and select."""
        return self.sock.fileno()

    def shutdown(self) -> None:
        """Ends the link from another thread: a read blocked on it returns EOF."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.sock.close()

    def _require_authenticated(self) -> None:
        if not self.authenticated:
            raise RuntimeError("a link carries messages only once authenticated")

    def _message_deadline(self) -> float:
        if self.deadline is not None:
            return self.deadline
        return time.monotonic() + self.limits.message_s

    def _read(self, size: int, deadline: float) -> bytes:
        data = bytearray(size)
        view, got = memoryview(data), 0
        while got < size:
            self.sock.settimeout(self._left(deadline))
            count = self.sock.recv_into(view[got:])
            if not count:
                raise EOFError("the connection closed")
            got += count
        return bytes(data)

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        return left

    def _reason(self, error: BaseException) -> str:
        if isinstance(error, TimeoutError):
            return f"no handshake within {self.handshake_s:g} s"
        return str(error)
