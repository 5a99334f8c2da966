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

from diagnose.cli.common import EXIT_INTERRUPTED, EXIT_VERDICTS
from diagnose.core.vocab import Phase, VerdictKind
from diagnose.launch.launcher import Launcher, LaunchOptions
from diagnose.launch.live import print_outcome, run_with_live_view, run_with_tui
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
        return FaultSpec(rank=self.culprit, at=Phase.EXECUTE_MODEL, kind="hang", step=0)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "engine", "generate", "--model", self.model,
                "-tp", str(self.tp), "-pp", str(self.pp), "--prompt", PROMPT, "--max-tokens", "32"]

    def __str__(self) -> str:
        return f"{self.model}, tp={self.tp} pp={self.pp}, {self.tp * self.pp} worker processes " \
               f"on the CPU"


DEMO = DemoJob("tiny-llama", 2, 4)
REAL_DEMO = DemoJob("smollm2-135m", 3, 2)   # TP divides 9 heads and 3 KV heads: 1 or 3


def run_demo(run_dir: str | None, use_tui: bool, real: bool = False) -> int:
    job = REAL_DEMO if real else DEMO
    run_dir = run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    tui = use_tui and sys.stdout.isatty()
    opts = LaunchOptions(command=job.command(), run_dir=run_dir,
                         on_hang="report" if tui else "kill", faults=[job.fault])
    launcher = Launcher(opts)
    print(f"diag demo: {job}; injected fault {job.fault}; run dir {run_dir}", file=sys.stderr)
    outcome = run_with_tui(launcher, stop_on_exit=True) if tui else run_with_live_view(launcher)
    print_outcome(launcher, outcome)
    found = any(v.kind == VerdictKind.NEVER_REACHED and v.culprit_ranks == [job.culprit]
                for v in outcome.verdicts)
    return 0 if found and outcome.exit_code in (EXIT_VERDICTS, EXIT_INTERRUPTED) else 1
