"""Which lines of a chunk can matter, found without reading every line.

Each anchor is looked for with bytes.find over the whole chunk (memchr speed),
not with a regex per line; a line that holds one is parsed, and the anchors
it holds say which rules to try. The anchors are fewer than the rules'
needles (each costs a pass over the chunk) and every needle holds one.

A busy server's log is mostly HTTP access lines and throughput reports, and the
story needs only the errors among them and the latest sign of progress: an
access line counts when it is a 5xx, and of the rest only the chunk's last
successful POST and its last report of tokens generated.
"""
from __future__ import annotations

import re
from bisect import bisect_right
from itertools import accumulate

from diagnose.offline.logs.collectives import NCCL_RULES
from diagnose.offline.logs.rules import LINE_RULES, TRACEBACK_NEEDLES

RULES = LINE_RULES + NCCL_RULES
COMMON = (b"Traceback (most recent", b"above exception", b"CUDA error", b"emory",
          b"NCCL WARN", b"Root Cause", b"Starting vLLM", b"startup complete", b"collective",
          b"are the lagging ranks", b"signal", b"died unexpectedly", b"exit",
          b"is assigned as", b"last enqueued", b"local_rank:", b"need to load: -",
          b"non-default args", b"shutdown triggered", b"_size", b"worker failed:", b"diag: ")
HTTP_ERRORS = (b'HTTP/1.1" 5', b'HTTP/1.0" 5', b'HTTP/2" 5')
PROGRESS = (((b'HTTP/1.1" 2', b'HTTP/1.0" 2', b'HTTP/2" 2'), lambda line: b'"POST ' in line),
            ((b"generation throughput: ",), lambda line: _tokens(line) > 0))
ANCHORS = COMMON + HTTP_ERRORS
SAMPLED = tuple(rule for rule in RULES if rule.sampled)
ANCHOR_RULES = {anchor: tuple(rule for rule in RULES if not rule.sampled and any(
    anchor in needle.encode() for needle in rule.needles)) for anchor in COMMON}
ANCHOR_RULES.update({anchor: SAMPLED for anchor in HTTP_ERRORS})
ANCHOR_RULES.update({needle: SAMPLED for needles, _ in PROGRESS for needle in needles})
ALL_ANCHORS = tuple(ANCHOR_RULES)
for _needle in [n for rule in RULES if not rule.sampled for n in rule.needles] + list(
        TRACEBACK_NEEDLES):
    assert any(anchor in _needle.encode() for anchor in COMMON), f"no anchor for {_needle}"
# vLLM's process prefix, "\n(" first: a literal the regex engine searches fast
NAMES = re.compile(rb"\n(?:\x1b\[[0-9;]*m)?\(([A-Za-z][\w-]*)(?: rank=\d+)?(?: engine_index=\d+)?"
                   rb" pid=(\d+)")


def hits(blob: bytes, lines: list[bytes]) -> dict[int, list[bytes]]:
    """The lines of a chunk (blob: its lines joined) that hold an anchor, with the
    anchors they hold: one bytes.find per anchor over the whole chunk, not a regex
    per line; and the chunk's last signs of progress (PROGRESS)."""
    starts = list(accumulate((len(line) + 1 for line in lines), initial=0))
    found: dict[int, list[bytes]] = {}
    for anchor in ANCHORS:
        at = blob.find(anchor)
        while at >= 0:
            index = bisect_right(starts, at) - 1
            found.setdefault(index, []).append(anchor)
            at = blob.find(anchor, starts[index + 1])
    for needles, wanted in PROGRESS:
        last = max(blob.rfind(needle) for needle in needles)
        while last >= 0:
            index = bisect_right(starts, last) - 1
            if wanted(lines[index]):
                found.setdefault(index, []).append(needles[0])
                break
            last = max(blob.rfind(needle, 0, starts[index]) for needle in needles)
    return found


def _tokens(line: bytes) -> float:
    at = line.find(b"generation throughput: ") + len(b"generation throughput: ")
    number = line[at:at + 16].split(b" ", 1)[0]
    try:
        return float(number)
    except ValueError:
        return 0.0
