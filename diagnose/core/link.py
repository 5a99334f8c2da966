"""An authenticated TCP link between two processes that share a secret: the
engine's node link and diag's between launchers.

The handshake: each end sends a random 32-byte nonce; the connecting end then
sends HMAC-SHA256(secret, "connector" + both nonces); the listening end checks
it before it answers with its own, HMAC-SHA256(secret, "listener" + both
nonces), or with a refusal. So the secret never crosses the wire, a recorded
handshake is worth nothing on another connection (the other end's nonce is
new), and the listener proves nothing to a peer that has not proved itself.
Both ends then derive a session key, HMAC-SHA256(secret, "session" + both
nonces), and every message after carries HMAC-SHA256(session key, its
direction + its sequence number + its bytes): a message altered, replayed,
reordered or reflected back fails its check, and the link is dropped.

Until the handshake is over a message is at most HANDSHAKE_BYTES, nothing is
decoded, and every send and read must end by the handshake's deadline. After
it a message is at most `limits.max_bytes`, and each must be sent, or arrive
whole, within `limits.message_s`.

Messages are bytes behind a 4-byte length; a Codec turns objects into them and
back (the engine's links carry pickles, diag's JSON: `json_codec` bounds its
depth and refuses numbers that are not finite).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import math
import os
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any, Callable

LENGTH = struct.Struct("!I")
SEQUENCE = struct.Struct("!Q")
HANDSHAKE_BYTES = 256      # a nonce or a proof is far smaller
NONCE_BYTES = 32
TAG_BYTES = 32             # HMAC-SHA256
HELLO = b"hangscope-link-1 "
REFUSED = b"refused"
MAX_DEPTH = 64             # nesting of a JSON message


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
        """Both ends prove they know `key` (the module's docstring says how); the
        listening end (challenge_first) checks the other's proof before it
        gives its own. HandshakeError (the link closed) when the peer does not."""
        mine, other = (b"listener", b"connector") if challenge_first else (b"connector", b"listener")
        try:
            nonces = self._exchange_nonces(challenge_first)
            if not challenge_first:
                self._send_frame(_mac(key, mine + nonces))
            proof = self._recv_frame(HANDSHAKE_BYTES)
            if not hmac.compare_digest(proof, _mac(key, other + nonces)):
                if challenge_first:
                    self._send_frame(REFUSED)
                raise HandshakeError("wrong key", wrong_key=True)
            if challenge_first:
                self._send_frame(_mac(key, mine + nonces))
        except HandshakeError:
            self.close()
            raise
        except (EOFError, OSError) as error:
            self.close()
            raise HandshakeError(self._reason(error)) from None
        session = _mac(key, b"session" + nonces)
        self._sending = _Sealer(session, mine)
        self._receiving = _Sealer(session, other)
        self.authenticated = True

    def _exchange_nonces(self, listener_first: bool) -> bytes:
        """Both nonces, the listener's first."""
        nonce = os.urandom(NONCE_BYTES)
        self._send_frame(HELLO + nonce)
        theirs = self._recv_frame(HANDSHAKE_BYTES)
        if len(theirs) != len(HELLO) + NONCE_BYTES or not theirs.startswith(HELLO):
            raise HandshakeError("wrong key", wrong_key=True)   # as any other failed proof
        theirs = theirs[len(HELLO):]
        return nonce + theirs if listener_first else theirs + nonce

    def settle(self) -> None:
        """The handshake is over: from now on each message has its own deadline."""
        self.deadline = None

    def send(self, message: Any) -> None:
        self.send_bytes(self.codec.encode(message))

    def recv(self) -> Any:
        """The next message, decoded; EOFError when the peer closed the link,
        TimeoutError when it was too slow, OSError when the message is too long
        or fails its tag."""
        return self.codec.decode(self.recv_bytes(self.limits.max_bytes))

    def send_bytes(self, data: bytes) -> None:
        self._require_authenticated()
        self._send_frame(data + self._sending.seal(data))

    def recv_bytes(self, maxlength: int) -> bytes:
        """The next message's bytes, once its tag proves the peer sent it, in this
        order; ConnectionError (the link is no longer to be trusted) if not."""
        self._require_authenticated()
        frame = self._recv_frame(maxlength + TAG_BYTES, reported=-TAG_BYTES)
        if len(frame) < TAG_BYTES:
            raise ConnectionError("a message too short to carry its tag")
        data, tag = frame[:-TAG_BYTES], frame[-TAG_BYTES:]
        self._receiving.check(data, tag)
        return data

    def _send_frame(self, data: bytes) -> None:
        self.sock.settimeout(self._left(self._message_deadline()))
        self.sock.sendall(LENGTH.pack(len(data)) + data)

    def _recv_frame(self, maxlength: int, reported: int = 0) -> bytes:
        """One length-prefixed frame; `reported` adjusts the sizes an error names
        (a sealed message's tag is no part of the message)."""
        deadline = self._message_deadline()
        (length,) = LENGTH.unpack(self._read(LENGTH.size, deadline))
        if length > maxlength:
            raise OSError(f"a message of {length + reported} bytes, over the "
                          f"{maxlength + reported} allowed")
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
            try:
                count = self.sock.recv_into(view[got:])
            except ConnectionResetError:
                count = 0  # a peer that exits with bytes unread resets instead of closing
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


class _Sealer:
    """The tags of one direction's messages: HMAC-SHA256 under the session key
    of the direction, the message's sequence number and its bytes."""

    def __init__(self, session: bytes, direction: bytes):
        self.session, self.direction, self.sequence = session, direction, 0

    def seal(self, data: bytes) -> bytes:
        tag = self._tag(data)
        self.sequence += 1
        return tag

    def check(self, data: bytes, tag: bytes) -> None:
        if not hmac.compare_digest(tag, self._tag(data)):
            raise ConnectionError("a message that fails its authentication")
        self.sequence += 1

    def _tag(self, data: bytes) -> bytes:
        return hmac.new(self.session, self.direction + SEQUENCE.pack(self.sequence) + data,
                        hashlib.sha256).digest()


def _mac(key: bytes, message: bytes) -> bytes:
    return hmac.new(key, message, hashlib.sha256).digest()


def json_codec(default=None) -> Codec:
    """JSON messages, decoded with their nesting bounded (MAX_DEPTH) and only
    finite numbers: ValueError for anything else, never a RecursionError."""
    return Codec(lambda body: json.dumps(body, default=default).encode(), _decode_json)


def _decode_json(data: bytes) -> Any:
    try:
        body = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("a message nested too deep") from None
    _check_tree(body)
    return body


def _check_tree(body: Any) -> None:
    """ValueError if `body` nests deeper than MAX_DEPTH or holds a number that is
    not finite (1e999 parses as infinity), walked without recursion: one pass
    after the parse, where a parse_float call per number cost more than the parse."""
    if type(body) is float and not math.isfinite(body):
        raise ValueError(f"a message with {body}, which is no finite number")
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValueError(f"a message nested over {MAX_DEPTH} deep")
        for item in value.values() if isinstance(value, dict) else \
                value if isinstance(value, list) else ():
            if type(item) is float:
                if not math.isfinite(item):
                    raise ValueError(f"a message with {item}, which is no finite number")
            elif isinstance(item, (dict, list)):
                stack.append((item, depth + 1))


def _no_constant(name: str):
    raise ValueError(f"a message with {name}, which is no finite number")
