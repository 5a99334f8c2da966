"""The README's TUI picture (docs/images/tui-rank6.svg) from a real run: `diag demo
--no-tui` (tiny-llama, tp=2 pp=4 on the CPU, rank 6 hanging before its first
execute_model) in a fresh directory, then the TUI opened on that run dir with the
culprit selected, exported as SVG.

    .venv/bin/python scripts/readme_screenshot.py [--out docs/images/tui-rank6.svg]
    .venv/bin/python scripts/readme_screenshot.py --from RUN_DIR   # no new run

tests/test_readme_screenshot.py fails when the frames the committed picture names
are not the frames a run of today's code shows: run this script and commit its
picture then."""
from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)   # run as a script: the repo's packages come from the repo

from diagnose.launch.rundir import open_run  # noqa: E402
from tui.app import DiagApp  # noqa: E402

PICTURE = os.path.join(REPO, "docs", "images", "tui-rank6.svg")
SIZE = (120, 40)
RUN_DIR = os.path.join("runs", "demo")   # as the picture shows it: diag demo's own name
DEMO_TIMEOUT_S = 600


def run_demo(work: str) -> str:
    """The run dir of `diag demo --no-tui` run in `work`; SystemExit if the demo
    did not find its culprit."""
    done = subprocess.run([sys.executable, "-m", "diagnose.cli", "demo", "--no-tui",
                           "--run-dir", RUN_DIR], cwd=work, capture_output=True, text=True,
                          timeout=DEMO_TIMEOUT_S, env=dict(os.environ, PYTHONPATH=REPO))
    if done.returncode != 0:
        raise SystemExit(f"diag demo exited {done.returncode}:\n{done.stderr[-3000:]}")
    return RUN_DIR


async def picture(run_dir: str) -> str:
    """The TUI on `run_dir` once its first poll is on the screen and the culprit
    is selected, as SVG."""
    app = DiagApp(open_run(run_dir))
    async with app.run_test(size=SIZE) as pilot:
        while app.snapshot is None or app.selected_rank is None:
            await pilot.pause(0.05)
        await pilot.pause()
        return app.export_screenshot(title="diag")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=PICTURE, help="where the SVG goes (default: %(default)s)")
    parser.add_argument("--from", dest="source", metavar="RUN_DIR",
                        help="picture this run dir of `diag demo` instead of running it")
    args = parser.parse_args()
    out = os.path.abspath(args.out)
    if args.source:
        svg = asyncio.run(picture(args.source))
    else:
        with tempfile.TemporaryDirectory(prefix="readme-screenshot-") as work:
            run_dir = run_demo(work)
            os.chdir(work)          # the picture names the run dir as the demo does
            svg = asyncio.run(picture(run_dir))
    with open(out, "w") as sink:
        sink.write(svg)
    print(out)


if __name__ == "__main__":
    main()
