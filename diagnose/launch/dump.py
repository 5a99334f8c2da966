"""Stacks of every rank of a run, now: the probes' own dumps (every thread's
Python stack, written by each rank's heartbeat thread) and py-spy from outside."""
from __future__ import annotations

import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console
from rich.text import Text
from rich.tree import Tree

from diagnose.core.frames import is_native
from diagnose.core.schema import Document, as_json, stamped
from diagnose.core.shown import shown
from diagnose.core.snapshot import Snapshot
from diagnose.launch.collector import Collector, request_dump
from diagnose.launch.py_spy import py_spy_dump
from diagnose.offline.console import output_console

NATIVE_STYLE = "magenta"


def py_spy_all(snapshot: Snapshot, native: bool = False) -> tuple[dict, list[str]]:
    """py-spy every live rank of this host at once: one slow rank must not delay
    the rest. Ranks on other nodes have only their probe's stacks."""
    states = {str(rank): state for rank, state in snapshot.ranks.items()}
    if snapshot.driver is not None:
        states["driver"] = snapshot.driver
    here = socket.gethostname()
    live = {name: s.identity.pid for name, s in states.items()
            if s.alive and s.identity.host == here}
    with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
        dumps = dict(zip(live, pool.map(lambda pid: py_spy_dump(pid, native), live.values())))
    notes = [f"{name}: {d.note}" for name, d in dumps.items() if d.note]
    return {name: d.threads for name, d in dumps.items() if d.threads is not None}, notes


def dump_run(run_dir: str, native: bool = False) -> dict:
    """Ask every rank for its stacks, add py-spy's, write dump-<time>.json."""
    notes = request_dump(run_dir)
    collector = Collector(run_dir)
    snapshot = collector.snapshot()
    external, spy_notes = py_spy_all(snapshot, native)
    body = {
        "taken_at": snapshot.taken_at,
        "native": native,
        "stacks": {str(rank): s.stacks for rank, s in snapshot.ranks.items() if s.stacks},
        "py_spy": external,
        "notes": collector.notes + notes + spy_notes,
    }
    if snapshot.driver is not None and snapshot.driver.stacks:
        body["stacks"]["driver"] = snapshot.driver.stacks
    path, sink = _new_dump_file(run_dir)
    with sink:
        sink.write(as_json(stamped(Document.DUMP, body)))
    body["path"] = path
    return body


def _new_dump_file(run_dir: str):
    """dump-<time>.json, or dump-<time>-N.json: a file of its own, never one that is
    there already (diag overwrites only what it wrote)."""
    stem = os.path.join(run_dir, f"dump-{time.strftime('%Y%m%d-%H%M%S')}")
    for attempt in range(1000):
        path = f"{stem}-{attempt}.json" if attempt else f"{stem}.json"
        try:
            return path, open(path, "x")
        except FileExistsError:
            continue
    raise OSError(f"{stem}-*.json: a thousand dumps in one second")


def render_dump(body: dict, console: Console | None = None) -> None:
    """Each rank's stacks, both that it has: the probe's own (from inside), and
    py-spy's (from outside; with --native, its native frames marked)."""
    console = console or output_console(highlight=False)
    spy = "py-spy --native" if body["native"] else "py-spy"
    for name in sorted(set(body["stacks"]) | set(body["py_spy"]), key=_order):
        for source, threads in (("probe", body["stacks"].get(name)),
                                (spy, body["py_spy"].get(name))):
            if threads is not None:
                console.print(_tree(Text.assemble((_title(name), "bold"), f" ({source})"),
                                    threads))
    console.print(Text(f"written to {shown(body['path'])}", style="dim"))
    for note in body["notes"]:
        console.print(Text(f"note: {shown(note)}", style="dim"))


def _tree(title: Text, threads: dict[str, list[str]]) -> Tree:
    tree = Tree(title)
    for thread, frames in threads.items():
        branch = tree.add(Text(shown(thread)))
        for frame in frames:
            branch.add(Text(shown(frame), style=NATIVE_STYLE if is_native(frame) else ""))
    return tree


def _order(name: str) -> tuple:
    return (1, 0) if name == "driver" else (0, int(name))


def _title(name: str) -> str:
    return name if name == "driver" else f"rank {name}"
