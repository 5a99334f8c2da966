"""The driver's detokenizing per decode step: engine/core/detokenizer.py (the
tokenizer's DecodeStream) against the engine's code before it (a window of
tokens decoded twice a request, as vLLM does, in LLMEngine._update; kept here
as `Before`, as it was).

    python benchmarks/detokenize.py [--batch 1,32,128] [--steps 64] [--rounds 5]
        [--json benchmarks/results/detokenize.json]

For each batch size, that many requests each get one token a step for --steps
steps, from the embedded model's tokenizer's encoding of this repository's
docs (text, code, tables), no stop strings (as `vllm bench serve` sends);
rounds alternate which goes first. Both must give each request the text a
decode of its tokens gives. Host time per step: median of rounds.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

from engine.core.detokenizer import Detokenizer
from engine.model.loader import resolve_model

DOCS = Path(__file__).resolve().parents[1] / "docs"


def token_rows(backend, batch: int, steps: int) -> list[list[int]]:
    text = "\n".join(path.read_text() for path in sorted(DOCS.glob("*.md")))
    ids = backend.encode(text, add_special_tokens=False).ids
    return [ids[(row * steps) % (len(ids) - steps):][:steps] for row in range(batch)]


class Before:
    """The engine's detokenizing before detokenizer.py, one request's share of it."""

    def __init__(self, backend, stops: list[str], token_ids: list[int] | None = None):
        self.decode = lambda ids: backend.decode(ids, skip_special_tokens=True)
        self.stops, self.token_ids, self.text = stops, [] if token_ids is None else token_ids, ""
        self.sent_chars = self.prefix_offset = self.read_offset = 0

    def add(self, new_token_ids: list[int], finished: bool) -> tuple[str, int | None]:
        self.token_ids.extend(new_token_ids)
        searched = max(len(self.text) - max((len(s) - 1 for s in self.stops), default=0), 0)
        self.text += self._new_text(finished)
        hits = [i for i in (self.text.find(s, searched) for s in self.stops if s) if i >= 0]
        stop_at = min(hits) if hits else None
        if stop_at is not None:
            self.text, finished = self.text[:stop_at], True
        ready = len(self.text) if finished else max(
            len(self.text) - max((len(s) - 1 for s in self.stops), default=0), 0)
        released = self.text[self.sent_chars:ready]
        self.sent_chars = max(self.sent_chars, ready)
        return released, stop_at

    def _new_text(self, finished: bool) -> str:
        ids = self.token_ids
        known = self.decode(ids[self.prefix_offset:self.read_offset])
        window = self.decode(ids[self.prefix_offset:])
        if len(window) <= len(known) or (window.endswith("\ufffd") and not finished):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(ids)
        return window[len(known):]


def step_time(backend, rows: list[list[int]], stream: bool) -> tuple[float, list[str]]:
    """Seconds a step of all rows takes (mean over the steps), and the rows' texts."""
    requests = [(Detokenizer if stream else Before)(backend, []) for _ in rows]
    steps = len(rows[0])
    started = time.perf_counter()
    for step in range(steps):
        for request, row in zip(requests, rows):
            request.add(row[step:step + 1], step == steps - 1)
    return (time.perf_counter() - started) / steps, [request.text for request in requests]


def measure(backend, batch: int, steps: int, rounds: int) -> dict:
    rows = token_rows(backend, batch, steps)
    times = {"stream": [], "before": []}
    for round_ in range(rounds):
        for way in (("stream", "before") if round_ % 2 == 0 else ("before", "stream")):
            seconds, texts = step_time(backend, rows, way == "stream")
            times[way].append(seconds)
            assert texts == [backend.decode(row) for row in rows], f"{way}: text differs"
    stream_s, before_s = (statistics.median(times[way]) for way in ("stream", "before"))
    return {"batch": batch, "now_us": stream_s * 1e6, "before_us": before_s * 1e6,
            "before_over_now": before_s / stream_s, "rounds": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,32,128")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    backend = resolve_model("smollm2-135m").tokenizer().backend
    results = [measure(backend, int(batch), args.steps, args.rounds)
               for batch in args.batch.split(",")]
    print("| batch | before, us a step | now, us a step | before / now |")
    print("|---|---|---|---|")
    for row in results:
        print(f"| {row['batch']} | {row['before_us']:.0f} | {row['now_us']:.0f} | "
              f"{row['before_over_now']:.2f}x |")
    if args.json:
        Path(args.json).write_text(json.dumps(
            {"machine": f"{platform.machine()}, {platform.python_version()}",
             "steps": args.steps, "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
