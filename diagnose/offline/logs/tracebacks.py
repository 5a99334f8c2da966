"""Python tracebacks rebuilt from a log, one per process.

Each process has its own Assembler, so tracebacks of several processes that
interleave line by line come apart again, and a prefix on every line (vLLM's,
torchrun's) is already gone. An assembler keeps the last MAX_FRAMES frames only:
the innermost ones name the failure. A chained exception ("The above
exception was the direct cause ...") becomes one error with its cause.
"""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

MAX_FRAMES = 32          # innermost frames kept of one traceback
HELD = 4 * MAX_FRAMES    # indented lines held unread (a frame, its code, carets)
MAX_GAP = 400            # lines of its process without a frame before a traceback is dropped
MAX_MESSAGE = 300

FRAME = re.compile(r'\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)')
CARETS = re.compile(r"\s*[\^~]+\s*$")
EXC_NAME = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::(?: (?P<msg>.*))?)?$")
EXC_LIKE = re.compile(r"(Error|Exception|Exit|Interrupt|Timeout|Warning|Failure|Dead\w*)$")
CHAINED = ("The above exception was the direct cause", "During handling of the above exception")
# frames of the interpreter, the standard library, torch (and the code it compiles) and
# diag's own probe (which wraps torch.distributed in the ranks it watches) are not the
# program's own code
LIBRARY = re.compile(r"[/\\]lib[/\\]python3[\d.]*[/\\](?!(?:site|dist)-packages)|"
                     r"[/\\](?:site|dist)-packages[/\\](?:torch|triton)[/\\]|"
                     r"[/\\]diagnose[/\\]probe[/\\]|torch_compile_cache|torchinductor|^<", re.I)
HANGSCOPE = re.compile(r"[/\\]diagnose[/\\]probe[/\\]")   # our code inside the job: the probe


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str
    code: str = ""

    def where(self) -> str:
        parts = self.path.replace("\\", "/").split("/")
        name = "/".join(parts[-2:]) if parts[-1] == "__init__.py" and len(parts) > 1 else parts[-1]
        return f"{name}:{self.line} {self.func}"

    def library(self) -> bool:
        return bool(LIBRARY.search(self.path))

    def hangscope(self) -> bool:
        return bool(HANGSCOPE.search(self.path))


@dataclass
class PyError:
    type: str                      # as printed: "vllm.v1.engine.exceptions.EngineDeadError"
    message: str
    frame: Frame | None            # the innermost frame of the program's own code
    innermost: Frame | None
    functions: tuple[str, ...]     # the kept frames' functions, innermost last
    cause: str | None              # the exception it was raised from
    line: int                      # the exception line's number
    text: str                      # the exception line as printed
    when: float | None = None      # its time (the scanner fills these in)
    stamp: str | None = None

    @property
    def short(self) -> str:
        return self.type.rsplit(".", 1)[-1]


class Assembler:
    """One process's traceback state: idle, in frames, or just after an exception
    (which may still turn out to be the cause of the next one).

    The indented lines of a traceback (frames, their code, carets) can be handed
    over undecoded (hold); they are read only when the next unindented line comes,
    and only the last HELD of them: a deep traceback costs a deque append a line."""
    __slots__ = ("frames", "gap", "state", "done", "cause", "code_due", "held")

    def __init__(self):
        self.held: deque[bytes] = deque(maxlen=HELD)
        self.frames: deque[Frame] = deque(maxlen=MAX_FRAMES)
        self.state = "idle"        # idle | frames | after | chained
        self.done: PyError | None = None
        self.cause: str | None = None
        self.gap = 0
        self.code_due = False

    @property
    def busy(self) -> bool:
        return self.state in ("frames", "chained")

    def hold(self, body: bytes) -> None:
        """An indented line of the traceback under way, read later if at all."""
        self.held.append(body)

    def feed(self, body: str, number: int, text: str) -> tuple[bool, PyError | None]:
        """(whether the line belongs to a traceback, an error that is now complete)."""
        if self.held:
            held, self.held = self.held, deque(maxlen=HELD)
            for line in held:
                self._indented(line.decode("utf-8", "replace").rstrip("\r"))
        stripped = body.strip()
        if self.state in ("after", "chained"):
            if stripped.startswith(CHAINED):
                self.state = "chained"
                return True, None
            if not stripped:
                return True, None
            if stripped.startswith("Traceback (most recent call last)") and self.state == "chained":
                self.cause, self.done = self.done.type if self.done else None, None
                self._start()
                return True, None
            finished, self.done, self.state = self.done, None, "idle"
            return self.feed(body, number, text)[0], finished
        if stripped.startswith("Traceback (most recent call last)"):
            self.cause = None
            self._start()
            return True, None
        if self.state != "frames":
            return False, None
        if not stripped or body[:1].isspace():
            self._indented(body)
            return True, None
        name = EXC_NAME.match(stripped)
        if (name and self.frames and not name["type"].isupper()
                and (EXC_LIKE.search(name["type"]) or self.gap == 0)):
            self.done = self._error(name, number, text)
            self.state, self.frames = "after", deque(maxlen=MAX_FRAMES)
            return True, None
        self.gap += 1
        if self.gap > MAX_GAP:
            self.state, self.frames = "idle", deque(maxlen=MAX_FRAMES)
        return False, None

    def _indented(self, body: str) -> None:
        """A frame, the code under it, or carets."""
        frame = FRAME.match(body) if 'File "' in body[:16] else None
        if frame:
            self.frames.append(Frame(frame["path"], int(frame["line"]), frame["func"].strip()))
            self.gap, self.code_due = 0, True
            return
        stripped = body.strip()
        if self.code_due and stripped and not CARETS.match(body) and self.frames:
            last = self.frames.pop()
            self.frames.append(Frame(last.path, last.line, last.func, stripped))
        self.code_due = False

    def flush(self) -> PyError | None:
        """At the end of the file: the error still waiting for a possible chain."""
        done, self.done, self.state = self.done, None, "idle"
        return done

    def _start(self) -> None:
        self.frames, self.held = deque(maxlen=MAX_FRAMES), deque(maxlen=HELD)
        self.state, self.gap, self.code_due = "frames", 0, False

    def _error(self, name: re.Match, number: int, text: str) -> PyError:
        frames = list(self.frames)
        own = next((frame for frame in reversed(frames) if not frame.library()), None)
        message = (name["msg"] or "").strip()
        if len(message) > MAX_MESSAGE:
            message = message[:MAX_MESSAGE - 1] + "…"
        return PyError(name["type"], message, own, frames[-1] if frames else None,
                       tuple(frame.func for frame in frames), self.cause, number, text)
