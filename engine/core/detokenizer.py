"""One request's text as its tokens come, and where a stop string ends it.

Each token is decoded once, by the tokenizers library's incremental decoder
(DecodeStream), so a step costs the same however long the output grew; vLLM's
detokenizer, and this engine's before, decoded a window of tokens twice a step
in Python (2.5x the time: benchmarks/detokenize.py). The stream holds text back
while it ends in an unfinished character; when the request finishes there,
those tokens' bytes are decoded as they are (U+FFFD), as a decode of the whole
output gives them. Text is released up to what may be the start of a stop
string, and the stop strings are looked for in the new text only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tokenizers import Tokenizer as Backend
from tokenizers.decoders import DecodeStream


@dataclass
class Detokenizer:
    backend: Backend
    stops: list[str]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    sent_chars: int = 0          # text streamed so far
    stream: DecodeStream = field(default_factory=lambda: DecodeStream(skip_special_tokens=True))
    decoded: int = 0             # tokens whose text is in `text`

    def __post_init__(self):
        # how much of unfinished text is held back: what may be a stop string's start
        self.hold = max((len(stop) for stop in self.stops), default=1) - 1

    def add(self, new_token_ids: list[int], finished: bool) -> tuple[str, int | None]:
        """The text these tokens release for streaming, and where in `text` the first
        stop string begins (the text is cut there), if one does."""
        searched = max(len(self.text) - self.hold, 0)
        new = self._new_text(new_token_ids, finished)
        stop_at = None
        if new:
            self.text += new
            stop_at = _first_stop(self.text, self.stops, searched) if self.stops else None
            if stop_at is not None:
                self.text = self.text[:stop_at]
        done = finished or stop_at is not None
        ready = len(self.text) if done else max(len(self.text) - self.hold, 0)
        if ready <= self.sent_chars:
            return "", stop_at
        released, self.sent_chars = self.text[self.sent_chars:ready], ready
        return released, stop_at

    def _new_text(self, new_token_ids: list[int], finished: bool) -> str:
        text = ""
        for token_id in new_token_ids:
            self.token_ids.append(token_id)
            text += self._step(token_id)
        if finished and self.decoded < len(self.token_ids):
            text += self._held_text()    # an unfinished character's bytes: U+FFFD
        return text

    def _step(self, token_id: int) -> str:
        """The text this token releases. `step` takes one id in every tokenizers
        release that has the stream (0.21 on)."""
        try:
            chunk = self.stream.step(self.backend, token_id)
        except Exception:  # noqa: BLE001 - tokenizers raises a bare Exception
            # a decoder that rewrites text behind the stream: the held tokens' own
            # text, and a new stream after them
            self.stream = DecodeStream(skip_special_tokens=True)
            return self._held_text()
        if chunk is None:
            return ""
        self.decoded = len(self.token_ids)
        return chunk

    def _held_text(self) -> str:
        """The text of the tokens the stream holds, decoded on their own."""
        text = self.backend.decode(self.token_ids[self.decoded:], skip_special_tokens=True)
        self.decoded = len(self.token_ids)
        return text


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the first stop string in text[start:] begins."""
    hits = [i for i in (text.find(stop, start) for stop in stops if stop) if i >= 0]
    return min(hits) if hits else None
