"""diag attach --tui: the TUI's source, which samples the job again at every
poll and rewrites the run dir, so the run dir always holds what the TUI shows."""
from __future__ import annotations

from dataclasses import replace

from diagnose.analysis.thresholds import Thresholds
from diagnose.attach.run import AttachOptions, Attached, attach, write_run_dir
from diagnose.core.snapshot import Snapshot, Verdict
from diagnose.launch.rundir import Source

LIVE_ROUNDS = 3


class AttachSource(Source):
    def __init__(self, opts: AttachOptions, first: Attached):
        super().__init__(opts.run_dir)
        self.opts = replace(opts, rounds=min(opts.rounds, LIVE_ROUNDS))
        self.attached, self.fresh = first, True

    @property
    def notes(self) -> list[str]:
        return self.attached.notes

    def snapshot(self) -> Snapshot:
        """The first sample (taken before the TUI opened), then a new one each time."""
        if not self.fresh:
            self.attached = attach(self.opts, progress=False)
            write_run_dir(self.attached, self.opts.run_dir, again=True)
        self.fresh = False
        return self.attached.snapshot

    def verdicts(self, snapshot: Snapshot, thresholds: Thresholds | None = None) -> list[Verdict]:
        return self.attached.verdicts

    def request_dump(self) -> list[str]:
        return ["diag attach samples every rank's stacks at each refresh: select a rank to "
                "see its stack"]
