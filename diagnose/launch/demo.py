"""diag demo: the README's main job. tiny-llama at tp=2, pp=4 on the CPU under
diag launch, with rank 6 (the last stage's TP rank 0) hanging before its first
execute_model; the verdict shows live, then the report."""
from __future__ import annotations

import os
import sys
import time

from diagnose.core.vocab import Phase, VerdictKind
from diagnose.launch.launcher import EXIT_HUNG, Launcher, LaunchOptions
from diagnose.launch.live import print_outcome, run_with_live_view, run_with_tui
from diagnose.probe.faults import FaultSpec

DEMO_FAULT = FaultSpec(rank=6, at=Phase.EXECUTE_MODEL, kind="hang", step=0)
DEMO_COMMAND = ["-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2", "-pp", "4",
                "--prompt", "The hang debugger names the culprit", "--max-tokens", "32"]


def run_demo(run_dir: str | None, use_tui: bool) -> int:
    run_dir = run_dir or os.path.join("runs", time.strftime("demo-%Y%m%d-%H%M%S"))
    tui = use_tui and sys.stdout.isatty()
    opts = LaunchOptions(command=[sys.executable, *DEMO_COMMAND], run_dir=run_dir,
                         on_hang="report" if tui else "kill", faults=[DEMO_FAULT])
    launcher = Launcher(opts)
    print(f"diag demo: tiny-llama, tp=2 pp=4, 8 worker processes on the CPU; injected fault "
          f"{DEMO_FAULT}; run dir {run_dir}", file=sys.stderr)
    outcome = run_with_tui(launcher, stop_on_exit=True) if tui else run_with_live_view(launcher)
    print_outcome(launcher, outcome)
    found = any(v.kind == VerdictKind.NEVER_REACHED and v.culprit_ranks == [6] for v in outcome.verdicts)
    return 0 if found and outcome.exit_code in (EXIT_HUNG, 130) else 1
