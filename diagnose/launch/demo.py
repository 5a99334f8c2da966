"""diag demo: the README's main job. tiny-llama at tp=2, pp=4 on the CPU under
diag launch, with rank 6 (the last stage's TP rank 0) hanging before its first
execute_model; the verdict shows live, then the report. tiny-llama has random
weights (the engine shows its tokens as ids); `--real` runs the embedded
SmolLM2-135M instead, at a layout its 9 heads and 3 KV heads split into."""
from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from typing import Callable

from diagnose.cli.common import EXIT_INTERRUPTED, EXIT_VERDICTS
from diagnose.core.vocab import FaultKind, Phase, VerdictKind
from diagnose.launch.launcher import Launcher, Outcome
from diagnose.launch.options import LaunchOptions
from diagnose.launch.live import print_outcome
from diagnose.probe.faults import FaultSpec

PROMPT = "The hang debugger names the culprit"


@dataclass(frozen=True)
class DemoJob:
    model: str
    tp: int
    pp: int

    @property
    def culprit(self) -> int:
        """The last stage's TP rank 0: the rank that samples and replies."""
        return (self.pp - 1) * self.tp

    @property
    def fault(self) -> FaultSpec:
        return FaultSpec(rank=self.culprit, at=Phase.EXECUTE_MODEL, kind=FaultKind.HANG, step=0)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "engine", "generate", "--model", self.model,
                "-tp", str(self.tp), "-pp", str(self.pp), "--prompt", PROMPT, "--max-tokens", "32"]

    def __str__(self) -> str:
        return f"{self.model}, tp={self.tp} pp={self.pp}, {self.tp * self.pp} worker processes " \
               f"on the CPU"


DEMO = DemoJob("tiny-llama", 2, 4)
REAL_DEMO = DemoJob("smollm2-135m", 3, 2)   # TP divides 9 heads and 3 KV heads: 1 or 3


def run_demo(run_dir: str | None, watch: Callable[[Launcher], Outcome], tui: bool,
             real: bool = False) -> int:
    """watch runs the launcher in front of a view: the TUI (tui set: the job waits,
    hung, until the TUI is closed) or the plain live view (the hang ends it)."""
    job = REAL_DEMO if real else DEMO
    run_dir = run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    opts = LaunchOptions(command=job.command(), run_dir=run_dir,
                         on_hang="report" if tui else "kill", faults=[job.fault])
    launcher = Launcher(opts)
    print(f"diag demo: {job}; injected fault {job.fault}; run dir {run_dir}", file=sys.stderr)
    outcome = watch(launcher)
    print_outcome(launcher, outcome)
    found = any(v.kind == VerdictKind.NEVER_REACHED and v.culprit_ranks == [job.culprit]
                for v in outcome.verdicts)
    return 0 if found and outcome.exit_code in (EXIT_VERDICTS, EXIT_INTERRUPTED) else 1
