"""The dump directory of PyTorch's torch.distributed.debug (torch 2.13:
`start_debug_server(dump_dir=..., dump_interval=...)`) -> a Snapshot.

Rank 0's debug frontend asks every rank's worker server for its data each
interval and writes one text file per handler, `<handler>_<%Y%m%d_%H%M%S>.txt`
(the dumper's local time): by default `stacks` (every rank's Python stacks, as
faulthandler writes them, under a `=== Rank N: ADDRESS ===` line, or `Error:
STATUS` for a rank that did not answer), `fr_trace` (torch's own Flight
Recorder tables, made by its analyzer) and `torchcomms_health_check`. On gloo,
torch 2.13 writes no `fr_trace`: its analyzer fails on gloo's empty pg_config.

Of these, diag reads the newest `stacks` file: each rank's threads, and its
main thread's innermost frame (the thread whose outermost frame is a
`<module>`, else the first with frames; faulthandler's "Current thread" is the
worker's own handler). The file holds no collective, so these ranks alone name
no culprit; where the directory also holds Flight Recorder dumps, their ranks
get these stacks. The files are read whole only under MAX_FILE_BYTES, as text;
nothing is unpickled or run.
"""
from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

from diagnose.core.files import read_small
from diagnose.core.frames import faulthandler_threads, frame_label
from diagnose.core.snapshot import Identity, RankState, Snapshot
from diagnose.core.vocab import Role

DUMP_FILE = re.compile(r"^(?P<handler>[a-z_]+?)_(?P<at>\d{8}_\d{6})\.txt$")
RANK_HEAD = re.compile(r"^=== Rank (?P<rank>\d{1,9}): (?P<address>.*) ===$")
STACKS = "stacks"
MAX_FILE_BYTES = 64 << 20
MAX_RANKS = 1 << 17
MAX_THREADS = 1024          # threads kept per rank


class DebugDumpError(Exception):
    """A dump directory or stacks file that cannot be read; the message says why."""


@dataclass
class DebugDump:
    snapshot: Snapshot
    notes: list[str]
    stacks_file: str        # the stacks dump read


def is_debug_file(name: str) -> bool:
    return DUMP_FILE.match(name) is not None


def looks_like_debug_dir(path: str) -> bool:
    try:
        return any(is_debug_file(name) for name in os.listdir(path))
    except OSError:
        return False


def read_debug_dir(path: str) -> DebugDump:
    """The newest stacks file of the directory as a Snapshot taken when it was
    written; DebugDumpError when there is none or it is not what torch writes."""
    dumps = sorted((match["at"], match["handler"], name) for name in os.listdir(path)
                   if (match := DUMP_FILE.match(name)))
    stacks = [name for at, handler, name in dumps if handler == STACKS]
    if not stacks:
        found = ", ".join(sorted({handler for _, handler, _ in dumps}))
        raise DebugDumpError(f"{path}: torch.distributed.debug dumps ({found}) but no "
                             f"stacks_<time>.txt: enable the 'stacks' dump")
    name = stacks[-1]
    notes = [f"{name}: the newest of {len(stacks)} stacks dumps"] if len(stacks) > 1 else []
    if not any(handler == "fr_trace" for _, handler, _ in dumps):
        notes.append("no fr_trace dump (torch 2.13 writes none on gloo): the stacks show where "
                     "each rank is, not which collective it waits in; for a verdict, give diag "
                     "the Flight Recorder dumps or run the job under diag launch")
    else:
        notes.append("fr_trace_*.txt are torch's analyzer tables, which diag does not read: "
                     "give it the Flight Recorder dumps themselves")
    taken_at = time.mktime(time.strptime(DUMP_FILE.match(name)["at"], "%Y%m%d_%H%M%S"))
    ranks = _read_stacks(os.path.join(path, name), notes)
    world = max(ranks) + 1
    states = {rank: _rank_state(rank, world, host, threads, taken_at)
              for rank, (host, threads) in sorted(ranks.items())}
    return DebugDump(Snapshot(taken_at=taken_at, run_dir=path, ranks=states), notes, name)


def _read_stacks(path: str, notes: list[str]) -> dict[int, tuple[str, list]]:
    """rank -> (host, its threads) of one stacks file."""
    name = os.path.basename(path)
    try:
        text = read_small(path, MAX_FILE_BYTES).decode("utf-8", "replace")
    except OSError as error:
        raise DebugDumpError(f"{name}: {error.strerror}") from None
    sections: dict[int, tuple[str, list[str]]] = {}
    lines = None
    for line in text.splitlines():
        head = RANK_HEAD.match(line)
        if head is None:
            if lines is not None:
                lines.append(line)
            continue
        rank = int(head["rank"])
        if rank in sections or len(sections) >= MAX_RANKS:
            notes.append(f"{name}: rank {rank} again or past {MAX_RANKS} ranks, skipped")
            lines = None
            continue
        lines = []
        sections[rank] = (_host(head["address"]), lines)
    if not sections:
        raise DebugDumpError(f"{name}: not torch.distributed.debug's stacks dump (no "
                             f"'=== Rank N: ADDRESS ===' line)")
    ranks = {}
    for rank, (host, body) in sections.items():
        threads = faulthandler_threads(body)[:MAX_THREADS]
        if not any(thread.frames for thread in threads):
            notes.append(f"{name}: rank {rank} gave no Python stack "
                         f"({(body[0] if body else 'nothing').strip()[:80]})")
        ranks[rank] = (host, threads)
    return ranks


def _host(address: str) -> str:
    """'http://vm:44747/handler/dump_traceback?' -> 'vm'."""
    found = re.match(r"^\w+://\[?([^\]/]+?)\]?(?::\d+)?/", address)
    return found[1] if found else ""


def _rank_state(rank: int, world: int, host: str, threads: list, taken_at: float) -> RankState:
    identity = Identity(role=Role.PROCESS, rank=rank, world_size=world, tp_rank=None,
                        tp_size=None, pp_rank=None, pp_size=None, host=host, pid=0, device="",
                        groups={})
    shown = [thread for thread in threads if thread.frames and not thread.current]
    main = next((thread for thread in shown if thread.frames[0][2] == "<module>"),
                shown[0] if shown else None)
    stacks = {(f"main thread 0x{thread.ident:x}" if thread is main else f"thread 0x{thread.ident:x}"):
              [frame_label(*frame) for frame in thread.frames] for thread in shown}
    return RankState(identity=identity, started_at=taken_at, heartbeat_at=taken_at, alive=True,
                     open_phases=[], frame=frame_label(*main.frames[-1]) if main else "",
                     phases=[], collectives=[], stacks=stacks or None)
