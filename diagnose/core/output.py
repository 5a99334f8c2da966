"""The command's own output: the file in the run dir that `diag launch` copies
it to, and the addresses a server in it announces (`http://HOST:PORT`, as the
engine, vLLM and uvicorn print them when they start to listen)."""
from __future__ import annotations

import re

OUTPUT_LOG = "output.log"
ADDRESS = re.compile(r"https?://(?:\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+):\d{1,5}\b", re.ASCII)


def addresses(lines, known: list[str] | None = None) -> list[str]:
    """`known`, then the addresses in `lines` not among them, in the order they came."""
    found = list(known or [])
    for line in lines:
        for address in ADDRESS.findall(line):
            if address not in found:
                found.append(address)
    return found
