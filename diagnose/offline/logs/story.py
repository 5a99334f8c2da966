"""From what the lines told to what the reader is told: the first failure, the
chain that followed it, then the other findings, then the notes.

The candidates for the first failure are the failures of their own (an
exception, a CUDA error, an OOM, a dead rank), vLLM's hang and the rank behind
in a collective; the earliest wins (the log's time, else its line order). The
links of its chain are the consequences that came after it (the engine core's
fatal error, EngineDeadError, HTTP 500, the RPC timeout, torchrun ending the
job) and the ranks that lost or waited for a peer, whenever they printed it.
Errors printed after someone asked the job to stop, with no failure before,
are that stop and not a failure.
"""
from __future__ import annotations

from diagnose.offline.logs import diag_lines
from diagnose.offline.logs.behind import behind
from diagnose.offline.logs.hang import hang
import re

from diagnose.offline.logs.model import Finding, Kind, Proc, Severity
from diagnose.offline.logs.scan import detail
from diagnose.offline.logs.words import LMCACHE_ADVICE, finding, link, root

ROOTS = (Kind.EXCEPTION, Kind.CUDA_ERROR, Kind.OUT_OF_MEMORY, Kind.RANK_DIED, Kind.WORKER_DIED)
LINKS = (Kind.ENGINE_CORE_FATAL, Kind.ENGINE_DEAD, Kind.HTTP_ERROR, Kind.RPC_TIMEOUT,
         Kind.JOB_STOPPED, Kind.WORKER_DIED, Kind.RANK_DIED, Kind.PEER_LOST,
         Kind.COLLECTIVE_TIMEOUT, Kind.BROADCAST_WAIT)
DEATHS = (Kind.WORKER_DIED, Kind.RANK_DIED)      # after another failure: its consequence
VICTIMS = (Kind.PEER_LOST, Kind.COLLECTIVE_TIMEOUT)   # in the chain wherever they were printed
SIGTERM_CODES = (-15, 15, -2)
PID = re.compile(r" pid=\d+")


class Teller:
    def __init__(self, scan):
        self.scan, self.job, self.files = scan, scan.job, scan.files
        self.torchrun_root = scan.torchrun_root
        self.kinds: dict[Kind, list] = {}
        self.also: dict[int, list] = {}        # a failure -> the same failure in other ranks
        self.again: dict[int, list] = {}       # a failure -> the same in a later process like it
        for entry in sorted(scan.entries.values(), key=lambda entry: entry.first.order):
            self.kinds.setdefault(entry.first.kind, []).append(entry)

    def describe(self, proc: Proc) -> tuple[str, int | None]:
        return self.scan.procs.describe(proc)

    def tell(self) -> list[Finding]:
        notes = self._notes() + self._after_diag_stop()
        roots = self._roots()
        stop = self.kinds.get(Kind.SHUTDOWN)
        if stop:
            asked = stop[0].first.order
            before = [entry for entry in roots if entry.first.order < asked]
            if not before:
                late = [entry for kind in ROOTS + LINKS for entry in self.kinds.get(kind, [])
                        if entry.first.order > asked and kind != Kind.BROADCAST_WAIT]
                if late:
                    notes.append(self._after_shutdown(stop[0], late))
                for kind in ROOTS + LINKS:
                    self.kinds[kind] = [entry for entry in self.kinds.get(kind, [])
                                        if entry.first.order < asked]
                roots = []
        candidates = [(entry.first.order, "root", entry) for entry in roots]
        candidates += [(entry.first.order, "diag", diag_lines.verdict(entry, self))
                       for entry in self.kinds.get(Kind.DIAG_VERDICT, [])]
        stalled = hang(self.kinds, self)
        if stalled and stalled[0].severity == Severity.NOTE:
            notes.insert(0, stalled[0])
            stalled = None
        lagging = behind(self.scan.collectives, self)
        candidates += [(found[1], "found", found[0]) for found in (stalled, lagging) if found]
        candidates.sort(key=lambda item: item[0])
        findings = self._first(candidates, lagging[0] if lagging else None)
        warnings = [finding(entry, self, Severity.WARNING)
                    for entry in self.kinds.get(Kind.NCCL_WARNING, [])]
        return findings + warnings + notes

    def _roots(self) -> list:
        """The failures of their own, earliest first. The same exception in several
        processes (every TP rank hits the same bug) is one failure; a process that
        died after the first failure died of it."""
        roots = sorted((entry for kind in ROOTS for entry in self.kinds.get(kind, [])
                        if not _stopping(entry)), key=lambda entry: entry.first.order)
        kept, seen = [], {}
        for entry in roots:
            if kept and entry.first.kind in DEATHS:
                continue
            event = entry.first
            same = (event.kind, event.proc.name, detail(event))
            first = seen.get(same)
            if first is None:
                seen[same] = entry
                kept.append(entry)
            elif self._who(first) == self._who(entry):
                self.again.setdefault(id(first), []).append(entry)   # the same process restarted
            else:
                self.also.setdefault(id(first), []).append(entry)    # another rank, same fault
        return kept

    def _who(self, entry) -> str:
        return PID.sub("", self.describe(entry.first.proc)[0])

    def _root(self, entry) -> Finding:
        made = root(entry, self)
        again = self.again.get(id(entry), [])
        if again:
            made.count += sum(other.count for other in again)
            made.last = max((other.latest for other in again), key=lambda event: event.order).stamp
            made.summary += f" (and in {len(again)} later process{'es' if len(again) > 1 else ''} "
            made.summary += "of the same name)"
        others = self.also.get(id(entry), [])
        if others:
            names = [self.describe(other.first.proc)[0] for other in others]
            more = f" and {len(names) - 3} more" if len(names) > 3 else ""
            made.summary += f" (the same in {', '.join(names[:3])}{more})"
        return made

    def _first(self, candidates: list, lagging: Finding | None) -> list[Finding]:
        """The first failure with its chain, then the failures that are not in it."""
        if not candidates:
            return self._orphans()
        order, what, item = candidates[0]
        first = self._root(item) if what == "root" else item
        # after a failure, vLLM's hang signs are its consequence (they join the chain), and
        # so is a collective finding, unless it blames another rank
        keep_lagging = lagging is not None and (
            what != "root" or (lagging.rank is not None and lagging.rank != first.rank))
        kinds = set(LINKS)
        if item is lagging or keep_lagging:
            kinds.discard(Kind.COLLECTIVE_TIMEOUT)
        if first.kind == Kind.EXECUTE_MODEL_HANG:
            kinds.discard(Kind.BROADCAST_WAIT)
        chain = sorted((entry for kind in LINKS if kind in kinds
                        for entry in self.kinds.get(kind, [])
                        if entry is not item and (entry.first.order > order or kind in VICTIMS)),
                       key=lambda entry: entry.first.order)
        first.chain += [link(entry, self, first.severity) for entry in _unique(chain)]
        chained = {id(entry) for entry in chain}
        others = [self._root(other) if kind_of == "root" else other
                  for _, kind_of, other in candidates[1:]
                  if (kind_of == "root" and id(other) not in chained)
                  or (other is lagging and keep_lagging) or kind_of == "diag"]
        return [first] + others

    def _orphans(self) -> list[Finding]:
        """Consequences only: the failure they follow is in some other log."""
        orphans = sorted((entry for kind in LINKS if kind != Kind.BROADCAST_WAIT
                          for entry in self.kinds.get(kind, [])),
                         key=lambda entry: entry.first.order)
        if not orphans:
            return []
        first = link(orphans[0], self, Severity.FAILURE)
        first.advice = ("a consequence, and the failure it follows is not in this log: pass the "
                        "log of the process it names (or every process's log) to diag logs")
        first.chain = [link(entry, self, Severity.FAILURE) for entry in orphans[1:]]
        return [first]

    def _after_diag_stop(self) -> list[Finding]:
        """What the job printed after diag ended it is its being stopped: out of the
        failures and their chains, into one note."""
        ended = self.kinds.get(Kind.DIAG_ENDED)
        if not ended:
            return []
        cut = ended[0].first.order
        late = sorted((entry for kind in ROOTS + LINKS for entry in self.kinds.get(kind, [])
                       if entry.first.order > cut), key=lambda entry: entry.first.order)
        for kind in ROOTS + LINKS:
            self.kinds[kind] = [entry for entry in self.kinds.get(kind, [])
                                if entry.first.order < cut]
        if not late:
            return []
        words = sorted({link(entry, self, Severity.NOTE).summary for entry in late})
        return [diag_lines.after_stop(ended[0], late, self, words)]

    def _notes(self) -> list[Finding]:
        return [finding(entry, self, Severity.NOTE, advice=LMCACHE_ADVICE,
                        summary=f"LMCache 'need to load: {entry.first.info['tokens']}'")
                for entry in self.kinds.get(Kind.LMCACHE_NEGATIVE_LOAD, [])]

    def _after_shutdown(self, stop, late: list) -> Finding:
        who, _ = self.describe(stop.first.proc)
        count = sum(entry.count for entry in late)
        words = sorted({link(entry, self, Severity.NOTE).summary for entry in late})
        at = stop.first.stamp or f"line {stop.first.line}"
        note = finding(late[0], self, Severity.NOTE, kind=Kind.AFTER_SHUTDOWN,
                       summary=f"{count} error{'s' if count > 1 else ''} after the stop that "
                               f"{who} was asked for at {at}: " + "; ".join(words[:3]),
                       advice="part of stopping the job, not a failure")
        note.count = count
        return note


def _unique(chain: list) -> list:
    """The same error printed again without a prefix (multiprocessing's "Process
    EngineCore:" traceback repeats the engine core's own) is one link."""
    kept, seen = [], set()
    for entry in chain:
        error = entry.first.info.get("exception")
        same = (entry.first.kind, error.type, error.message) if error else None
        if same is not None and same in seen and entry.first.proc.key[1] == "out":
            continue
        seen.add(same)
        kept.append(entry)
    return kept


def _stopping(entry) -> bool:
    """A worker ended by SIGTERM: the job was being stopped, not a failure of its own."""
    return entry.first.kind == Kind.WORKER_DIED and entry.first.info.get("code") in SIGTERM_CODES


def tell(scan) -> list[Finding]:
    return Teller(scan).tell()
