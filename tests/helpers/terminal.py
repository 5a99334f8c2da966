"""A command in a real pseudo-terminal, its screen read through a VT100 emulator."""
import re
import time

import pexpect
import pyte

COLUMNS, LINES = 160, 48


class Terminal:
    """A pty running the command, read through a VT100 emulator."""

    def __init__(self, argv: list[str], env: dict[str, str], columns: int = COLUMNS,
                 lines: int = LINES):
        self.screen = pyte.Screen(columns, lines)
        self.stream = pyte.ByteStream(self.screen)
        self.child = pexpect.spawn(argv[0], argv[1:], env=env, dimensions=(lines, columns))
        self.received_at = 0.0    # time.monotonic() when the last output came, before its parsing

    def text(self) -> str:
        return "\n".join(self.screen.display)

    def read(self, timeout: float) -> bool:
        """What the child wrote within `timeout`, onto the screen; False at its end."""
        try:
            output = self.child.read_nonblocking(65536, timeout=timeout)
            self.received_at = time.monotonic()
            self.stream.feed(output)
        except pexpect.TIMEOUT:
            pass
        except pexpect.EOF:
            return False
        return True

    def wait_for(self, pattern: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.read(0.2):
                break
            if re.search(pattern, self.text()):
                return self.text()
        raise AssertionError(f"{pattern!r} not on screen:\n{self.text()}")
