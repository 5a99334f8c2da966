"""A 4 MB prompt against `python -m engine serve`: does it stall the requests
beside it, and what does it cost the server's memory?

    PYTHONPATH=. python benchmarks/server_big_prompt.py --label after \
        [--checkout PATH] [--flags "--max-prompt-chars 8388608"] [--big 4] [--json FILE]

One arm per run, merged by --label into the JSON (default benchmarks/results/
server_big_prompt.json): the server is started from --checkout (default this
one; give a checkout of an older commit for the "before" arm) on smollm2-135m,
a real BPE tokenizer. Measured, over real HTTP:

  alone_s    a 1-token completion's latency with nothing else running (median of 5)
  beside_s   the same request's latency, sent while a 4 MB prompt is being handled
  big_s      how long the 4 MB request took, and its status (400: context or cap)
  rss_mb     the server process's RSS before and after --big such requests, one by one

Prints a table of every arm in the file.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import aiohttp
import psutil

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results", "server_big_prompt.json")
MODEL = "smollm2-135m"
BIG_BYTES = (4 << 20) - 64 * 1024   # under the server's 4 MiB body cap, with the JSON
SENTENCE = "The quick brown fox jumps over the lazy dog. "


def start(checkout: str, flags: list[str]) -> tuple[subprocess.Popen, str]:
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([sys.executable, "-m", "engine", "serve", MODEL, "--port", "0",
                             "--host", "127.0.0.1", "--max-model-len", "256", *flags],
                            cwd=checkout, env=dict(os.environ, PYTHONPATH=checkout),
                            stdout=subprocess.PIPE, stderr=log)
    line = proc.stdout.readline().decode()
    if not line.startswith("serving"):
        proc.kill()
        log.seek(0)
        raise SystemExit(f"the server did not start: {line!r}\n{log.read()[-3000:].decode()}")
    return proc, line.split(" on ")[-1].strip()


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> tuple[int, float]:
    started = time.monotonic()
    async with session.post(url + "/v1/completions", json={
            "model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0}) as response:
        await response.read()
        return response.status, time.monotonic() - started


async def measure(url: str, pid: int, big: int) -> dict:
    prompt = (SENTENCE * (BIG_BYTES // len(SENTENCE) + 1))[:BIG_BYTES]
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        alone = [(await complete(session, url, "Hello"))[1] for _ in range(5)]
        rss_before = psutil.Process(pid).memory_info().rss
        big_task = asyncio.create_task(complete(session, url, prompt))
        await asyncio.sleep(0.5)                 # the big request is being read and handled
        beside_status, beside = await complete(session, url, "Hello")
        big_status, big_s = await big_task
        for _ in range(big - 1):
            await complete(session, url, prompt)
        rss_after = psutil.Process(pid).memory_info().rss
    return {"alone_s": statistics.median(alone), "beside_s": beside, "beside_status": beside_status,
            "big_s": big_s, "big_status": big_status, "big_requests": big,
            "rss_mb": [round(rss_before / 2**20), round(rss_after / 2**20)]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--label", required=True, help="the arm's name, e.g. before or after")
    parser.add_argument("--checkout", default=REPO, help="where the server's code is")
    parser.add_argument("--flags", default="", help="more flags for engine serve")
    parser.add_argument("--big", type=int, default=4, help="4 MB requests for the RSS figure")
    parser.add_argument("--json", default=RESULTS)
    args = parser.parse_args()
    proc, url = start(os.path.abspath(args.checkout), shlex.split(args.flags))
    try:
        result = asyncio.run(measure(url, proc.pid, args.big))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    commit = subprocess.run(["git", "-C", args.checkout, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    result |= {"commit": commit, "flags": args.flags, "cpus": os.cpu_count(),
               "load_1m": round(os.getloadavg()[0], 1), "python": platform.python_version()}
    arms = json.load(open(args.json)) if os.path.exists(args.json) else {}
    arms[args.label] = result
    with open(args.json, "w") as sink:
        json.dump(arms, sink, indent=1)
    print(f"{'arm':<16}{'alone s':>9}{'beside s':>10}{'big s':>8}{'big':>5}{'RSS MB':>12}  flags")
    for label, arm in arms.items():
        print(f"{label:<16}{arm['alone_s']:>9.3f}{arm['beside_s']:>10.3f}{arm['big_s']:>8.1f}"
              f"{arm['big_status']:>5}{'%d->%d' % tuple(arm['rss_mb']):>12}  {arm['flags']}")


if __name__ == "__main__":
    main()
