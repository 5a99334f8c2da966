"""Streaming: `diag logs` on a 1 GB log, in bounded memory.

    PYTHONPATH=. python benchmarks/log_stream.py [--size-mb 1024] [--serving 0.75]
        [--log FILE] [--dir /tmp] [--keep] [--json benchmarks/results/log_stream.json]

Unless --log names an existing log, writes one of SIZE MB from the real lines of
tests/fixtures/logs/: each copy holds every fixture once (the vLLM crash, hang
and healthy runs, torchrun, NCCL: dense with tracebacks and failures), then a
stretch of serving made of the real access and throughput lines of the vLLM
runs, so that serving is the --serving share of the bytes, as in a server's
log; every copy has its own pids and hours. Then runs `diag logs --json` on it
in a child process, on its first eighth, and on a log of the fixtures alone
(--serving 0, the densest content) of an eighth the size, and reports wall and
CPU seconds, MB/s and the child's peak RSS (from os.wait4): the same peak at
an eighth and at the full size is flat memory. The aim: 1 GB in under a
minute.

Prints a table and writes the numbers as JSON.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "logs")
AIM_S = 60.0
MB = 1024 * 1024
# the parts of a line that vary from copy to copy: a vLLM pid, vLLM's "MM-DD HH"
# and glog's "MMDD HH" (minutes and seconds are kept)
VARYING = re.compile(r"(?<=pid=)(\d+)|\b(\d\d)-(\d\d) (\d\d)(?=:\d\d:\d\d)|"
                     r"(?<=[IWEF])(\d\d)(\d\d) (\d\d)(?=:\d\d:\d\d\.)")


SERVING = re.compile(r'"(?:POST|GET) \S+ HTTP/1.1" 200|generation throughput: ')


def template(serving: float) -> tuple[list, int]:
    """One copy: the fixtures' text, then the serving stretch, as literal parts and
    varying fields; and its size."""
    texts = [open(path, encoding="utf-8").read()
             for path in sorted(glob.glob(os.path.join(FIXTURES, "*.log")))]
    fixtures = "".join(texts)
    stretch = "".join(line for text in texts for line in text.splitlines(keepends=True)
                      if SERVING.search(line))
    repeat = round(len(fixtures) * serving / (1 - serving) / len(stretch)) if serving else 0
    text = fixtures + stretch * repeat
    parts, start = [], 0
    for found in VARYING.finditer(text):
        parts.append(text[start:found.start()])
        if found.group(1):
            parts.append(("pid", int(found.group(1))))
        elif found.group(2):
            parts.append(("vllm", int(found.group(2)), int(found.group(3)), int(found.group(4))))
        else:
            parts.append(("glog", int(found.group(5)), int(found.group(6)), int(found.group(7))))
        start = found.end()
    parts.append(text[start:])
    return parts, len(text.encode())


def _shifted(field: tuple, copy: int) -> str:
    if field[0] == "pid":
        return str(field[1] + 1000 * copy % 4_000_000)
    _, month, day, hour = field
    hours = ((month - 1) * 28 + day - 1) * 24 + hour + copy
    month, day, hour = hours // (28 * 24) % 12 + 1, hours // 24 % 28 + 1, hours % 24
    dash = "-" if field[0] == "vllm" else ""
    return f"{month:02d}{dash}{day:02d} {hour:02d}"


def write_log(path: str, size_mb: float, serving: float) -> tuple[int, float]:
    parts, block = template(serving)
    varying = {part for part in parts if isinstance(part, tuple)}
    started, written, copy = time.monotonic(), 0, 0
    with open(path, "w", encoding="utf-8") as sink:
        while written < size_mb * MB:
            fields = {part: _shifted(part, copy) for part in varying}
            sink.write("".join(fields[part] if isinstance(part, tuple) else part for part in parts))
            written += block
            copy += 1
    return copy, time.monotonic() - started


def first_part(path: str, size: int, out_dir: str) -> str:
    """The first SIZE bytes of path, cut at a line."""
    part = os.path.join(out_dir, "part.log")
    with open(path, "rb") as source, open(part, "wb") as sink:
        left = size
        while left > 0:
            block = source.read(min(left, 8 * MB))
            if not block:
                break
            sink.write(block)
            left -= len(block)
        sink.write(source.readline())
    return part


def run_diag(path: str) -> dict:
    """`diag logs --json PATH` in a child: wall time, its peak RSS, what it found."""
    env = dict(os.environ, PYTHONPATH=os.path.join(HERE, "..") + os.pathsep
               + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        child = subprocess.Popen([sys.executable, "-m", "diagnose.cli", "logs", "--json", path],
                                 stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.monotonic() - started
        child.returncode = os.waitstatus_to_exitcode(status)
        if child.returncode not in (0, 1):
            err.seek(0)
            raise SystemExit(f"diag logs {path} exited {child.returncode}: "
                             f"{err.read()[-2000:].decode(errors='replace')}")
        out.seek(0)
        findings = json.loads(out.read())["findings"]
    size = os.path.getsize(path)
    return {"mb": round(size / MB, 1), "seconds": round(seconds, 2),
            "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "mb_per_s": round(size / MB / seconds, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "exit": child.returncode, "findings": len(findings),
            "first": f"{findings[0]['kind']}: {findings[0]['summary'][:70]}" if findings else ""}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--serving", type=float, default=0.75,
                        help="the share of the bytes that is serving (default 0.75)")
    parser.add_argument("--log", help="an existing log to read instead of writing one")
    parser.add_argument("--dir", default=tempfile.gettempdir(), help="where the log is written")
    parser.add_argument("--keep", action="store_true", help="keep the written log")
    parser.add_argument("--json", default=os.path.join(HERE, "results", "log_stream.json"))
    args = parser.parse_args()
    load = [round(value, 2) for value in os.getloadavg()]   # the machine may be shared
    work = tempfile.mkdtemp(prefix="log_stream-", dir=args.dir)
    path, written = args.log, None
    try:
        if path is None:
            path = os.path.join(work, "big.log")
            copies, seconds = write_log(path, args.size_mb, args.serving)
            written = {"copies": copies, "serving_share": args.serving,
                       "write_seconds": round(seconds, 1)}
        dense = os.path.join(work, "dense.log")
        write_log(dense, os.path.getsize(path) / MB / 8, 0.0)
        rows = [dict(run_diag(first_part(path, os.path.getsize(path) // 8, work)), log="eighth"),
                dict(run_diag(path), log="whole"), dict(run_diag(dense), log="fixtures only")]
    finally:
        for name in os.listdir(work):
            if not (args.keep and name == "big.log"):
                os.remove(os.path.join(work, name))
        if not os.listdir(work):
            os.rmdir(work)
    print(f"{'log':<14} {'MB':>8} {'seconds':>8} {'CPU s':>7} {'MB/s':>7} {'peak RSS MB':>12} "
          f"{'exit':>5}  first finding")
    for row in rows:
        print(f"{row['log']:<14} {row['mb']:>8} {row['seconds']:>8} {row['cpu_seconds']:>7} "
              f"{row['mb_per_s']:>7} {row['peak_rss_mb']:>12} {row['exit']:>5}  {row['first']}")
    met = rows[1]["seconds"] < AIM_S * rows[1]["mb"] / 1024
    print(f"aim: 1 GB in under {AIM_S:.0f} s: {'met' if met else 'NOT met'}; peak RSS "
          f"{rows[0]['peak_rss_mb']} MB at {rows[0]['mb']} MB, {rows[1]['peak_rss_mb']} MB at "
          f"{rows[1]['mb']} MB")
    result = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                          "platform": platform.platform(), "load_average_before": load},
              "log": args.log or "written from tests/fixtures/logs", "written": written,
              "aim_s_per_gb": AIM_S, "met": met, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as sink:
        json.dump(result, sink, indent=1)
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
