"""diag launch --relaunch-on-cuda-error: an asynchronous CUDA error is reported at
a later, unrelated call; once more with CUDA_LAUNCH_BLOCKING=1 on the rank that died,
the error is raised by the launch that failed. On each run, the rank's main
thread is found where the error reached it: the exception that left a phase
(the probe's error file), else its stack in the fatal-signal dump (NCCL's
watchdog aborts the rank with SIGABRT), else a traceback in the output.

NCCL's watchdog is left as it is on the blocking rank: the probe writes the
exception before any clean-up, and the watchdog's abort ends the run at once.
Without it (TORCH_NCCL_RETHROW_CUDA_ERRORS=0) the rank would go on into
destroy_process_group with a broken CUDA context, which may never return.
"""
from __future__ import annotations

import json
import linecache
import os
import re
import sysconfig
from dataclasses import replace

from diagnose.core import runfile
from diagnose.core.output import OUTPUT_LOG
from diagnose.core.frames import faulthandler_threads, frame_label
from diagnose.core.schema import Document, read_version
from diagnose.core.snapshot import Snapshot
from diagnose.launch.launcher import Launcher, Outcome
from diagnose.offline import report
from diagnose.probe import recorder

CUDA_ERROR_MARKERS = ("CUDA error", "device-side assert", "Triton Error [CUDA]")
TRACEBACK_FRAMES = 8
DEVICE_ASSERT = re.compile(r"(?P<file>[^\s:]+):(?P<line>\d+): (?P<kernel>.+?): block: \[[\d, ]*\], "
                           r"thread: \[[\d, ]*\] Assertion .* failed")
TRITON_LAUNCH = re.compile(r"\b(\w+)\s*\[[^\]]*\]\s*\(")     # kernel[grid](args)
TRACEBACK_FRAME = re.compile(r'^\s*File "(?P<file>.+)", line (?P<line>\d+), in (?P<name>.+)$')
LIBRARY_DIRS = tuple({sysconfig.get_paths()[key] + os.sep
                      for key in ("stdlib", "platstdlib", "purelib", "platlib")})

Frame = tuple[str, int, str, str]   # file, line, function, source line


def cuda_error_rank(output: str, snapshot: Snapshot) -> int | None:
    """The first worker that died, when the output shows a CUDA error; else None."""
    if not _is_cuda_error(output):
        return None
    exits = [exit for exit in (snapshot.driver.worker_exits if snapshot.driver else [])
             if exit.exitcode != 0]
    if exits:
        return min(exits, key=lambda exit: exit.at).rank
    dead = [(state.heartbeat_at, rank) for rank, state in snapshot.ranks.items() if not state.alive]
    return min(dead)[1] if dead else None


def error_site(run_dir: str, rank: int, output: str) -> dict:
    """Where the rank's main thread was when the CUDA error reached it: the error,
    the call site (the innermost frame of the program itself, not of Python, an
    installed package or the probe), its source line, and the last frames."""
    exception = _exception_frames(run_dir, rank)
    fatal = _fatal_frames(run_dir, rank)
    if exception and _is_cuda_error(exception[0]):
        source, (error, frames) = "exception", exception
    elif fatal:
        source, (error, frames) = "fatal signal", fatal
    elif exception:
        source, (error, frames) = "exception", exception
    else:
        source, (error, frames) = "output", _output_traceback(output)
    if not _is_cuda_error(error):
        error = _first_cuda_error(output) or error
    site = next((frame for frame in reversed(frames) if _is_program_frame(frame[0])), None)
    return {"error": error, "source": source if frames else None,
            "site": frame_label(*site[:3]) if site else None,
            "code": site[3] if site else None,
            "frames": [frame_label(*frame[:3]) for frame in frames[-TRACEBACK_FRAMES:]]}


def failed_kernel(output: str, site: dict) -> str | None:
    """The kernel's name from its device-side assert line, else (Triton prints
    'unknown' there) from the launch `kernel[grid](...)` at the site."""
    asserted = DEVICE_ASSERT.search(output)
    if asserted and asserted["kernel"] != "unknown":
        return asserted["kernel"]
    launch = TRITON_LAUNCH.search(site["code"] or "")
    return launch[1] if launch else None


def _exception_frames(run_dir: str, rank: int) -> tuple[str, list[Frame]] | None:
    try:
        with open(os.path.join(run_dir, runfile.error_file_name(rank))) as source:
            body = read_version(Document.ERROR, json.load(source))
        return body["error"], [(file, int(line), name, code)
                               for file, line, name, code in body["frames"]]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fatal_frames(run_dir: str, rank: int) -> tuple[str, list[Frame]] | None:
    """The main thread's frames in faulthandler's dump, outermost first."""
    try:
        with open(os.path.join(run_dir, runfile.fatal_file_name(rank)), errors="replace") as source:
            lines = source.read().splitlines()
    except OSError:
        return None
    if not lines or not lines[0].startswith(runfile.FATAL_MAIN_THREAD):
        return None
    main = int(lines[0].split()[-1], 16)
    frames = next((thread.frames for thread in faulthandler_threads(lines[1:])
                   if thread.ident == main and thread.frames), None)
    if frames is None:
        return None
    error = next((line for line in lines if line.startswith("Fatal Python error")), "")
    return error.strip(), [(file, line, name, linecache.getline(file, line).strip())
                           for file, line, name in frames]


def _output_traceback(output: str) -> tuple[str | None, list[Frame]]:
    """The first traceback whose exception is a CUDA error, else the first line
    that names one."""
    lines = output.splitlines()
    error_at = [i for i, line in enumerate(lines) if _is_cuda_error(line)]
    for at in error_at:
        start = max((i for i in range(at) if lines[i].startswith("Traceback")), default=None)
        if start is None:
            continue
        frames = []
        for i in range(start, at):
            frame = TRACEBACK_FRAME.match(lines[i])
            if frame:
                code = lines[i + 1].strip() if not TRACEBACK_FRAME.match(lines[i + 1]) else ""
                frames.append((frame["file"], int(frame["line"]), frame["name"], code))
        if frames:
            return lines[at].strip(), frames
    return (lines[error_at[0]].strip() if error_at else None), []


def _first_cuda_error(output: str) -> str | None:
    return next((line.strip() for line in output.splitlines() if _is_cuda_error(line)), None)


def _is_cuda_error(text: str | None) -> bool:
    return bool(text) and any(marker in text for marker in CUDA_ERROR_MARKERS)


def _is_program_frame(path: str) -> bool:
    return not (path.startswith(("<", recorder.DIAGNOSE_DIR) + LIBRARY_DIRS)
                or f"{os.sep}site-packages{os.sep}" in path
                or f"{os.sep}dist-packages{os.sep}" in path)


def relaunch_on_cuda_error(launcher: Launcher) -> Outcome | None:
    """Run the command again with CUDA_LAUNCH_BLOCKING=1 on the rank that died of a
    CUDA error; both error sites go into the first run's report, side by side on
    the terminal. None: no such death."""
    output = _read_output(launcher.opts.run_dir)
    rank = cuda_error_rank(output, launcher.snapshot)
    if rank is None:
        return None
    opts = replace(launcher.opts, run_dir=os.path.join(launcher.opts.run_dir, "blocking"),
                   launch_blocking=str(rank), output=None)
    outcome = Launcher(opts).run()
    blocking_output = _read_output(opts.run_dir)
    blocking = error_site(opts.run_dir, rank, blocking_output)
    device_assert = DEVICE_ASSERT.search(blocking_output) or DEVICE_ASSERT.search(output)
    body = {"rank": rank, "kernel": failed_kernel(blocking_output + output, blocking),
            "device_assert": device_assert[0] if device_assert else None,
            "first_run": error_site(launcher.opts.run_dir, rank, output),
            "launch_blocking_run": blocking, "launch_blocking_report": outcome.report_path}
    launcher.add_to_report(cuda_error=body)
    report.render_cuda_error(body)
    return outcome


def _read_output(run_dir: str) -> str:
    try:
        with open(os.path.join(run_dir, OUTPUT_LOG), "rb") as log:
            return log.read().decode("utf-8", "replace")
    except FileNotFoundError:
        return ""
