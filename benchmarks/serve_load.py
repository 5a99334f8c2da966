"""Throughput of `python -m engine serve` under concurrent streaming load.

For each layout, starts a real server, sends N streamed completions from C
concurrent clients (prompts of mixed lengths, a fixed number of output tokens
each), and reports requests/s, output tokens/s and time to first token.

    .venv/bin/python benchmarks/serve_load.py [--requests 256] [--concurrency 64] [--json serve_load.json]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
LAYOUTS = {"tp1": [], "tp2pp2": ["-tp", "2", "-pp", "2"]}


@dataclass
class Result:
    model: str
    layout: str
    requests: int
    concurrency: int
    seconds: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft_median_s: float
    ttft_p90_s: float


def start_server(model: str, flags: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "engine", "serve", model, "--host", "127.0.0.1", "--port", "0",
           "--disable-uvicorn-access-log", *flags]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE)
    line = proc.stdout.readline().decode()
    if not line.startswith("serving"):
        proc.wait()
        sys.exit(f"the server did not start: {' '.join(cmd)}")
    return proc, line.split(" on ")[-1].strip()


async def stream_one(session: aiohttp.ClientSession, url: str, model: str, prompt: str,
                     max_tokens: int) -> tuple[float, int]:
    """(time to first token, output tokens) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    started = time.monotonic()
    ttft, usage = None, None
    async with session.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        async for line in response.content:
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[len(b"data: "):])
            if chunk["choices"] and ttft is None:
                ttft = time.monotonic() - started
            usage = chunk.get("usage") or usage
    return ttft, usage["completion_tokens"]


async def load(url: str, model: str, num_requests: int, concurrency: int, max_tokens: int,
               seed: int = 0) -> tuple[float, list[tuple[float, int]]]:
    rng = random.Random(seed)
    prompts = [" ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(1, 60)))
               for _ in range(num_requests)]
    limit = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=concurrency)) as session:
        async def one(prompt: str) -> tuple[float, int]:
            async with limit:
                return await stream_one(session, url, model, prompt, max_tokens)
        await one("warm up")
        started = time.monotonic()
        results = await asyncio.gather(*(one(p) for p in prompts))
    return time.monotonic() - started, results


def run(model: str, layout: str, args: argparse.Namespace) -> Result:
    proc, url = start_server(model, LAYOUTS[layout])
    try:
        seconds, results = asyncio.run(load(url, model, args.requests, args.concurrency, args.max_tokens))
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    ttfts = sorted(t for t, _ in results)
    return Result(model, layout, args.requests, args.concurrency, round(seconds, 2),
                  round(args.requests / seconds, 2), round(sum(n for _, n in results) / seconds, 1),
                  round(statistics.median(ttfts), 3), round(ttfts[int(0.9 * (len(ttfts) - 1))], 3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-llama")
    parser.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--requests", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--json", default="serve_load.json", help="where to write the results")
    args = parser.parse_args()
    results = [run(args.model, layout, args) for layout in args.layouts]
    print(f"{'model':<14}{'layout':<8}{'requests':>9}{'clients':>8}{'req/s':>8}{'out tok/s':>11}"
          f"{'TTFT p50':>10}{'TTFT p90':>10}")
    for r in results:
        print(f"{r.model:<14}{r.layout:<8}{r.requests:>9}{r.concurrency:>8}{r.requests_per_s:>8}"
              f"{r.output_tokens_per_s:>11}{r.ttft_median_s:>10}{r.ttft_p90_s:>10}")
    Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")


if __name__ == "__main__":
    main()
