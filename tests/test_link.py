"""diagnose/core/link.py: the authenticated link the engine's nodes and diag's
launchers share, end to end over a socket pair."""
import json
import socket
import threading
import time

import pytest

from diagnose.core.link import HANDSHAKE_BYTES, Codec, HandshakeError, Limits, Link, json_codec
from diagnose.core.listener import Gate

KEY = b"the-shared-secret"
JSON = Codec(lambda body: json.dumps(body).encode(), json.loads)
QUICK = Limits(handshake_s=1.0, message_s=1.0, max_bytes=1 << 10)


class Recording:
    """A socket that keeps a copy of every byte sent through it."""

    def __init__(self, sock: socket.socket):
        self.sock, self.sent = sock, bytearray()

    def sendall(self, data: bytes) -> None:
        self.sent += data
        self.sock.sendall(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def both_ends(key_a=KEY, key_b=KEY):
    """(a's link, b's link, their handshake errors by name, a's socket); b listens."""
    sock_a, sock_b = socket.socketpair()
    a, b = Link(Recording(sock_a), JSON, QUICK), Link(sock_b, JSON, QUICK)
    errors = {}

    def run(name, link, key, first):
        try:
            link.authenticate(key, challenge_first=first)
        except HandshakeError as error:
            errors[name] = error

    other = threading.Thread(target=run, args=("a", a, key_a, False))
    other.start()
    run("b", b, key_b, True)
    other.join()
    return a, b, errors, a.sock


def test_ends_that_share_the_key_exchange_messages_and_the_key_never_crosses():
    a, b, errors, sock_a = both_ends()
    assert not errors and a.authenticated and b.authenticated
    a.settle(), b.settle()
    a.send({"ranks": {"2": "x" * 500}})
    assert b.recv() == {"ranks": {"2": "x" * 500}}
    b.send({"ok": True})
    assert a.recv() == {"ok": True}
    assert sock_a.sent and KEY not in sock_a.sent


def test_a_wrong_key_is_refused_on_both_ends():
    _, _, errors, _ = both_ends(key_a=b"another-secret")
    assert errors["a"].wrong_key and errors["b"].wrong_key


def test_nothing_is_decoded_before_the_handshake():
    a, _ = socket.socketpair()
    with pytest.raises(RuntimeError):
        Link(a, JSON, QUICK).recv()


def test_a_long_message_before_the_handshake_is_refused_unread():
    a, b = socket.socketpair()
    b.sendall((200 << 20).to_bytes(4, "big") + b"x" * 1000)
    with pytest.raises(HandshakeError, match=f"a message of {200 << 20} bytes, over the "
                                             f"{HANDSHAKE_BYTES} allowed"):
        Link(a, JSON, QUICK).authenticate(KEY, challenge_first=False)


def test_a_peer_that_drips_bytes_is_dropped_at_the_handshake_deadline():
    a, b = socket.socketpair()
    link = Link(a, JSON, QUICK)

    def drip():
        for byte in (32).to_bytes(4, "big") + b"x" * 32:
            try:
                b.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.3)
    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    with pytest.raises(HandshakeError, match="no handshake within 1 s"):
        link.authenticate(KEY, challenge_first=False)
    assert time.monotonic() - started < 1.5


def test_an_authenticated_message_must_arrive_whole_in_time():
    a, b, _, sock_a = both_ends()
    a.settle(), b.settle()
    sock_a.sendall((100).to_bytes(4, "big") + b"{")   # and the rest never comes
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        b.recv()
    assert 0.9 < time.monotonic() - started < 1.5


def test_a_peer_that_exits_with_bytes_unread_reads_as_closed_not_reset():
    a, b, _, _ = both_ends()
    a.settle(), b.settle()
    b.send({"unread": True})
    a.sock.close()      # a socket closed with bytes unread resets its peer
    with pytest.raises(EOFError, match="the connection closed"):
        b.recv()


def test_an_authenticated_message_over_the_limit_is_refused():
    a, b, _, _ = both_ends()
    a.settle(), b.settle()
    a.send({"big": "x" * 2000})
    with pytest.raises(OSError, match="over the 1024 allowed"):
        b.recv()


def test_a_message_altered_replayed_or_sent_back_fails_its_tag():
    a, b, _, sock_a = both_ends()
    a.settle(), b.settle()
    sent_before = len(sock_a.sent)
    a.send({"n": 1})
    frame = bytes(sock_a.sent[sent_before:])
    assert b.recv() == {"n": 1}
    sock_a.sock.sendall(frame)                                   # the same message again
    with pytest.raises(ConnectionError, match="fails its authentication"):
        b.recv()
    a2, b2, _, sock_a2 = both_ends()
    a2.settle(), b2.settle()
    altered = bytearray(frame)
    altered[6] ^= 1
    sock_a2.sock.sendall(bytes(altered))
    with pytest.raises(ConnectionError):
        b2.recv()
    a3, b3, _, sock_a3 = both_ends()
    a3.settle(), b3.settle()
    start = len(sock_a3.sent)
    a3.send({"n": 1})
    b3.sock.sendall(bytes(sock_a3.sent[start:]))                # reflected to its sender
    with pytest.raises(ConnectionError):
        a3.recv()


def test_the_listener_proves_nothing_to_a_peer_with_the_wrong_key():
    sock_a, sock_b = socket.socketpair()
    a, b = Link(Recording(sock_a), JSON, QUICK), Link(Recording(sock_b), JSON, QUICK)
    thread = threading.Thread(target=lambda: pytest.raises(
        HandshakeError, a.authenticate, b"another-secret", False))
    thread.start()
    with pytest.raises(HandshakeError):
        b.authenticate(KEY, challenge_first=True)
    thread.join()
    hello = 4 + len(b"hangscope-link-1 ") + 32
    assert bytes(b.sock.sent[hello:]) == (7).to_bytes(4, "big") + b"refused"


@pytest.mark.parametrize("raw, message", [
    (b"[" * 100_000 + b"]" * 100_000, "nested"),
    (b'{"a": ' * 65 + b"1" + b"}" * 65, "nested over 64"),
    (b'{"t": Infinity}', "no finite number"),
    (b'{"t": NaN}', "no finite number"),
    (b'{"t": 1e999}', "no finite number"),
    (b'[[2.5], {"t": [-1e999]}]', "no finite number"),
    (b'1e999', "no finite number"),
])
def test_json_messages_are_bounded_in_depth_and_finite(raw, message):
    with pytest.raises(ValueError, match=message):
        json_codec().decode(raw)
    assert json_codec().decode(b'{"t": [1.5, {"u": null}]}') == {"t": [1.5, {"u": None}]}


def test_the_gate_evicts_a_hosts_oldest_handshake_and_writes_a_refusal_a_second():
    lines = []
    gate = Gate(lines.append, per_source=2, total=3, interval=0.5)
    pairs = [socket.socketpair() for _ in range(4)]
    links = [Link(a, JSON, QUICK) for a, _ in pairs]
    assert gate.admit(links[0], ("10.0.0.1", 1)) and gate.admit(links[1], ("10.0.0.1", 2))
    assert gate.admit(links[2], ("10.0.0.1", 3))          # the host's oldest is ended
    assert pairs[0][1].recv(1) == b""
    assert not gate.admit(links[3], ("10.0.0.2", 4))      # three under way in all
    gate.release(links[0], ("10.0.0.1", 1))
    assert gate.admit(links[3], ("10.0.0.2", 4))
    for n in range(5):
        gate.refuse(f"refused {n}")
    time.sleep(0.6)
    gate.refuse("refused 5")
    assert lines[0] == "refused 0" and len(lines) == 2
    assert lines[1].startswith("refused 5 (and 4 more refused in the last ")
    for a, b in pairs:
        a.close(), b.close()
