"""A peer that tries a listener's patience: how long until it hangs up."""
import select
import socket
import time


def until_closed(sock: socket.socket, drip: bytes = b"", every_s: float = 3.0,
                 limit_s: float = 30) -> float:
    """Seconds until the listener closes the connection, sending the next byte of
    `drip` every `every_s` meanwhile."""
    started = next_byte_at = time.monotonic()
    while time.monotonic() - started < limit_s:
        if drip and time.monotonic() >= next_byte_at:
            try:
                sock.sendall(drip[:1])
            except OSError:
                return time.monotonic() - started
            drip, next_byte_at = drip[1:], next_byte_at + every_s
        if select.select([sock], [], [], 0.05)[0]:
            try:
                if not sock.recv(4096):
                    return time.monotonic() - started
            except ConnectionResetError:
                return time.monotonic() - started
    raise AssertionError(f"the listener kept the connection open for {limit_s} s")
