"""How long the TUI takes to show a new snapshot of a large job, and to answer a key:
1024 simulated ranks (tp=8 x pp=128), rank 6 hung before execute_model and everyone
else waiting on it.

    python benchmarks/tui_refresh.py [--tp 8] [--pp 128] [--refreshes 20] [--key-rounds 5]
        [--json PATH]

A refresh is what the UI thread does per poll: update the widgets with the grid
model the poll's thread made, lay out and render the whole screen (its CPU time,
so that the frame pacing Pilot waits through is left out). A key is the same
from the key press to the whole screen rendered, for the keys benchmarks/live_scale.py times in a
terminal (Enter: the detail and back; `/`: the filter opens; Enter: it closes),
with the app's footer and with Textual's own (built again at every change of
focus), rounds alternating. The analysis runs in the poll's worker thread, off
the UI thread; its time is printed beside. Writes the numbers as JSON (default
tui_refresh.json).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from helpers.synthetic import OP_S, Job  # noqa: E402  (tests/helpers/synthetic.py plays the probe)

from diagnose.analysis import analyze  # noqa: E402
from diagnose.core.snapshot import Judged, Snapshot  # noqa: E402
from textual.widgets import Footer  # noqa: E402

import tui.app  # noqa: E402
from tui.app import DiagApp  # noqa: E402
from tui.grid_model import build_grid  # noqa: E402

CULPRIT_RANK = 6
SCREEN = (160, 50)
KEYS = ["enter", "enter", "slash", "enter"]
FOOTERS = {"app's footer": tui.app.KeyFooter, "Textual's footer": Footer}


def hung_job(tp: int, pp: int) -> Snapshot:
    """Step 0: the culprit read the broadcast and hangs before execute_model; ranks of
    its stage wait in their TP all_reduce, every other rank finished the step."""
    job = Job(tp, pp)
    t = job.everyone_started(start=0.0, seconds=1.0)
    job.driver_step(0, t, None)
    culprit_stage = CULPRIT_RANK // tp
    for rank in job.ranks:
        start = t + OP_S + (rank // tp) * 4 * OP_S
        if rank == CULPRIT_RANK:
            job.dequeue(rank, start, start + OP_S)
            job.ranks[rank].ring_read += 1
        elif rank // tp == culprit_stage:
            job.step(rank, 0, start, stop="forward")
        else:
            job.dequeue(rank, job.step(rank, 0, start))
    job.now = t + 30.0
    return job.snapshot()


class StillSource:
    """The same snapshot and verdicts on every poll: the app's own polling stays
    cheap, so the timings are the refreshes'."""

    def __init__(self, snapshot: Snapshot, verdicts) -> None:
        self.fixed, self.fixed_verdicts = snapshot, verdicts
        self.run_dir = snapshot.run_dir

    live = False

    def judged(self) -> Judged:
        return Judged(self.fixed, tuple(self.fixed_verdicts))

    def launcher_judgment(self) -> None:
        return None

    def command(self) -> None:
        return None

    def request_dump(self) -> list[str]:
        return []

    def py_spy(self, pid: int, native: bool) -> None:
        return None


async def time_refreshes(snapshot: Snapshot, verdicts, refreshes: int) -> list[float]:
    """UI-thread CPU seconds per refresh of the running app, each with a later
    snapshot time: the new snapshot's widgets updated, laid out and the whole
    screen rendered. CPU time of the event loop's thread leaves out the idle
    time Pilot waits for the next frame."""
    app = DiagApp(StillSource(snapshot, verdicts))
    times = []
    async with app.run_test(size=SCREEN) as pilot:
        while app.snapshot is None:
            await pilot.pause(0.05)
        await pilot.pause()  # the first paint is start-up, not a refresh
        for index in range(refreshes):
            later = replace(snapshot, taken_at=snapshot.taken_at + 0.25 * (index + 1))
            made = (later, build_grid(later, verdicts))    # the poll's thread makes it
            start = time.thread_time()
            app.made, app.verdicts = made, verdicts
            app.snapshot = later
            await pilot.pause()
            app.screen._compositor.render_update(full=True)
            times.append(time.thread_time() - start)
    return times


async def time_keys(snapshot: Snapshot, verdicts, footer: type) -> list[float]:
    """UI-thread CPU seconds per key of KEYS, each until the whole screen is rendered,
    with `footer` as the app's footer; polls held off, so that only the key's work counts."""
    tui.app.KeyFooter = footer
    app = DiagApp(StillSource(snapshot, verdicts))
    try:
        async with app.run_test(size=SCREEN) as pilot:
            while app.snapshot is None:
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            app.rest_until = float("inf")
            times = []
            for key in KEYS:
                start = time.thread_time()
                await pilot.press(key)
                await pilot.pause()
                app.screen._compositor.render_update(full=True)
                times.append(time.thread_time() - start)
    finally:
        tui.app.KeyFooter = FOOTERS["app's footer"]
    return times


def best_of(runs: int, body) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        body()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tp", type=int, default=8)
    parser.add_argument("--pp", type=int, default=128)
    parser.add_argument("--refreshes", type=int, default=20)
    parser.add_argument("--key-rounds", type=int, default=5)
    parser.add_argument("--json", default="tui_refresh.json", help="where to write the numbers")
    args = parser.parse_args()

    snapshot = hung_job(args.tp, args.pp)
    verdicts = analyze(snapshot)
    analyze_s = best_of(3, lambda: analyze(snapshot))
    model_s = best_of(5, lambda: build_grid(snapshot, verdicts))
    refresh = asyncio.run(time_refreshes(snapshot, verdicts, args.refreshes))
    keys: dict[str, list[float]] = {name: [] for name in FOOTERS}
    for _ in range(args.key_rounds):
        for name, footer in FOOTERS.items():
            keys[name] += asyncio.run(time_keys(snapshot, verdicts, footer))
    result = {
        "ranks": len(snapshot.ranks), "tp": args.tp, "pp": args.pp, "screen": list(SCREEN),
        "refresh_ms_median": 1000 * statistics.median(refresh),
        "refresh_ms_max": 1000 * max(refresh),
        "grid_model_ms": 1000 * model_s,
        "key_ms": {name: [1000 * t for t in times] for name, times in keys.items()},
        "key_ms_median": {name: 1000 * statistics.median(times) for name, times in keys.items()},
        "analyze_ms": 1000 * analyze_s,
        "verdict": verdicts[0].summary if verdicts else None,
        "python": platform.python_version(),
    }
    print(f"{result['ranks']} ranks (tp={args.tp} pp={args.pp}), screen {SCREEN[0]}x{SCREEN[1]}")
    print(f"  refresh (UI thread CPU): median {result['refresh_ms_median']:.1f} ms, "
          f"max {result['refresh_ms_max']:.1f} ms over {args.refreshes}")
    print(f"  grid model (poll thread): {result['grid_model_ms']:.1f} ms")
    for name, times in keys.items():
        print(f"  a key (UI thread CPU), {name}: median {1000 * statistics.median(times):.1f} ms, "
              f"max {1000 * max(times):.1f} ms over {len(times)}")
    print(f"  analysis (poll thread): {result['analyze_ms']:.1f} ms")
    print(f"  verdict: {result['verdict']}")
    with open(args.json, "w") as out:
        json.dump(result, out, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
