"""The fuzzer of tests/test_fuzz_analyze.py and benchmarks/fuzz.py: damaged copies
of real input (recorded run dirs, Flight Recorder dumps, logs), each case run by
`diag analyze`'s or `diag logs`' main() in one worker process, judged by its exit
code, its traceback if any, and whether it answered within CASE_TIMEOUT_S."""
from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import random
import select
import shutil
import struct
import subprocess
import sys
import time
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
RUN_DIRS = ["runs/no_fault", "runs/rank6_never_reached"]
FR_DIRS = ["fr_hang", "fr_healthy", "fr_nccl_hang", "fr_peer/build_4_uneven_broadcast_oop_coalesced",
           "fr_peer/all_events"]
LOGS = ["engine_tp2pp2_rank3_sigkill.log", "nccl_watchdog_vllm23448.log",
        "nccl_desync_pytorch152623.log", "torchrun_gloo_skip.log"]
CASE_TIMEOUT_S = 30.0
SEED = 27
DEPTH = 200                      # nested values: deep, and still within json's and pickle's reach
VALUES = [None, -1, 0, 1, 2 ** 63, 10 ** 30, 1e308, float("inf"), float("nan"), "", "x", "0",
          "nccl:send 0->99", [], [[]], [1, "a"], {}, {"0": [0, 1]}, True, 0.5]


def deep() -> list:
    value: list = []
    for _ in range(DEPTH):
        value = [value]
    return value


# Mutations of one copied input directory.

def flip_bytes(directory: str, rng: random.Random) -> str:
    path = pick_file(directory, rng)
    raw = bytearray(read(path))
    if not raw:
        return "flip: empty file"
    for _ in range(rng.randint(1, 16)):
        at = rng.randrange(min(len(raw), 1416) if rng.random() < 0.5 else len(raw))
        raw[at] ^= 1 << rng.randrange(8)
    write(path, bytes(raw))
    return f"flip {os.path.basename(path)}"


def truncate(directory: str, rng: random.Random) -> str:
    path = pick_file(directory, rng)
    size = os.path.getsize(path)
    os.truncate(path, rng.randrange(size + 1) if size else 0)
    return f"truncate {os.path.basename(path)}"


def delete(directory: str, rng: random.Random) -> str:
    path = pick_file(directory, rng)
    os.remove(path)
    return f"delete {os.path.basename(path)}"


def swap_value(directory: str, rng: random.Random) -> str:
    """One value inside a JSON file, a probe file's identity, or a dump's pickle."""
    path = pick_file(directory, rng)
    name = os.path.basename(path)
    raw = read(path)
    try:
        if name.endswith(".probe"):
            raw = swap_in_identity(raw, rng)
        elif name.endswith(".json"):
            raw = json.dumps(swapped(json.loads(raw), rng)).encode()
        else:
            raw = pickle.dumps(swapped(pickle.loads(raw), rng), protocol=2)
    except Exception:            # already damaged by an earlier mutation: leave it so
        return f"swap {name}: not decodable, left"
    write(path, raw)
    return f"swap {name}"


def swap_in_identity(raw: bytes, rng: random.Random) -> bytes:
    from diagnose.core import runfile
    header = list(runfile.HEADER.unpack_from(raw))
    identity = swapped(json.loads(raw[runfile.IDENTITY_AT:]), rng)
    body = json.dumps(identity).encode()
    header[2], header[12] = runfile.IDENTITY_AT + len(body), len(body)
    return runfile.HEADER.pack(*header) + raw[runfile.HEADER.size:runfile.IDENTITY_AT] + body


def swapped(value, rng: random.Random):
    """`value` with one of its leaves (or inner containers) replaced."""
    spots = list(walk(value))
    if not spots:
        return rng.choice(VALUES)
    container, key = rng.choice(spots)
    container[key] = deep() if rng.random() < 0.1 else rng.choice(VALUES)
    return value


def walk(value, depth: int = 0):
    """(container, key) of every value inside `value`; tuples become lists."""
    if depth > 8:
        return
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, list) else ()
    for key, item in list(items):
        if isinstance(item, tuple):
            item = value[key] = list(item)
        yield value, key
        yield from walk(item, depth + 1)


def add_node_file(directory: str, rng: random.Random) -> str:
    """A multi-node head's report of a node, built from this run's own ranks."""
    from dataclasses import asdict

    from diagnose.launch.collector import Collector
    ranks = Collector(directory).snapshot().ranks
    report = {"node_rank": 1, "host": "other", "expected_since": 1.0, "received_at": 2.0,
              "connected": True, "finished": False, "dropped": False, "command_exit": None,
              "dump_done": 0,
              "ranks": {str(rank + len(ranks)): asdict(state) for rank, state in ranks.items()}}
    with open(os.path.join(directory, "node-1.json"), "w") as sink:
        json.dump(swapped(report, rng) if rng.random() < 0.7 else report, sink)
    return "add node-1.json"


def read(path: str) -> bytes:
    with open(path, "rb") as source:
        return source.read()


def write(path: str, raw: bytes) -> None:
    with open(path, "wb") as sink:
        sink.write(raw)


def pick_file(directory: str, rng: random.Random) -> str:
    names = sorted(os.listdir(directory))
    if not names:
        raise FileNotFoundError("no file left")
    return os.path.join(directory, rng.choice(names))


def pickle_bomb(directory: str, rng: random.Random) -> str:
    """A dump replaced by a few bytes that ask for gigabytes: a memo index
    (LONG_BINPUT) or a string's length (BINUNICODE8)."""
    path = pick_file(directory, rng)
    asks = rng.choice([b"}r" + struct.pack("<I", 2 ** rng.randint(20, 32) - 1) + b".",
                       b"\x8d" + struct.pack("<Q", 2 ** rng.randint(30, 63)) + b"x"])
    write(path, b"\x80\x04" + asks)
    return f"bomb {os.path.basename(path)}"


def huge_group(directory: str, rng: random.Random) -> str:
    """A dump whose every process group lists up to 100,000 ranks."""
    path = pick_file(directory, rng)
    try:
        dump = pickle.loads(read(path))
        ranks = str(list(range(rng.choice([2_000, 70_000, 100_000]))))
        for group in dump["pg_config"].values():
            group["ranks"] = ranks
    except Exception:            # already damaged, or no pg_config: leave it so
        return f"huge group {os.path.basename(path)}: not a dump, left"
    write(path, pickle.dumps(dump, protocol=2))
    return f"huge group {os.path.basename(path)}"


def hostile_lines(directory: str, rng: random.Random) -> str:
    """Escape sequences, NULs, invalid UTF-8 and a very long line in a log."""
    path = pick_file(directory, rng)
    lines = read(path).split(b"\n")
    for _ in range(rng.randint(1, 8)):
        at = rng.randrange(len(lines) + 1)
        lines.insert(at, rng.choice([b"\x1b[2J\x1b]0;owned\x07ERROR fine", b"\x00" * 64,
                                     b"\xff\xfe\xc3(" * 32, b"RuntimeError: " + b"x" * 2_000_000,
                                     b"[rank3]: " + b"\x1b[32m" * 1000]))
    write(path, b"\n".join(lines))
    return f"hostile lines {os.path.basename(path)}"


MUTATIONS = [flip_bytes, flip_bytes, truncate, swap_value, swap_value, delete]
FR_MUTATIONS = [pickle_bomb, huge_group]
LOG_MUTATIONS = [flip_bytes, truncate, hostile_lines, hostile_lines]


def make_case(rng: random.Random, target: str) -> tuple[list[str], list[str]]:
    """(the mutations done, the diag command's arguments)."""
    source = rng.choice(RUN_DIRS + FR_DIRS + ["logs"])
    if source == "logs":
        os.makedirs(target)
        for name in rng.sample(LOGS, rng.randint(1, 2)):
            shutil.copy(os.path.join(FIXTURES, "logs", name), target)
        mutations, args = LOG_MUTATIONS, ["logs"] + [os.path.join(target, name)
                                                     for name in sorted(os.listdir(target))]
    else:
        shutil.copytree(os.path.join(FIXTURES, source), target)
        mutations = MUTATIONS + ([add_node_file] if source in RUN_DIRS else FR_MUTATIONS)
        args = ["analyze", target]
    done = [source]
    for _ in range(rng.randint(1, 3)):
        try:
            done.append(rng.choice(mutations)(target, rng))
        except FileNotFoundError:
            break
    return done, args + rng.choice([[], ["--json"]] + [["--stall-timeout", "0"]] * (
        args[0] == "analyze"))


# The worker: runs `diag analyze` in-process, one case a line.

def worker() -> None:
    from diagnose.cli import main
    answer = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    for line in sys.stdin:
        args = json.loads(line)
        out, err = io.StringIO(), io.StringIO()
        result = {"rc": None, "traceback": None}
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                result["rc"] = main(args)
        except SystemExit as stop:
            result["rc"] = stop.code
        except BaseException:  # noqa: BLE001 - any exception out of main is what we look for
            result["traceback"] = traceback.format_exc()
        result["stderr"] = err.getvalue()
        answer.write(json.dumps(result) + "\n")
        answer.flush()


class Worker:
    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker"],
                                     cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)

    def run(self, args: list[str], timeout: float) -> dict | None:
        """The case's result, or None when it did not end within `timeout`."""
        self.proc.stdin.write(json.dumps(args) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        return json.loads(line) if line else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.proc.stdin.close()
        self.proc.stdout.close()


def fuzz(seconds: float, seed: int, work: str) -> tuple[int, list[str]]:
    """(cases run, failures) of `seconds` of cases from `seed`, in `work`."""
    rng = random.Random(seed)
    failures, cases, worker_proc = [], 0, Worker()
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline and len(failures) < 5:
            target = os.path.join(work, f"case-{cases}")
            mutations, args = make_case(rng, target)
            result = worker_proc.run(args, CASE_TIMEOUT_S)
            problem = judge(result)
            if problem:
                failures.append(f"{target} {mutations}: {problem}")
                if result is None:
                    worker_proc.stop()
                    worker_proc = Worker()
            else:
                shutil.rmtree(target)
            cases += 1
    finally:
        worker_proc.stop()
    return cases, failures


def judge(result: dict | None) -> str | None:
    if result is None:
        return f"no answer within {CASE_TIMEOUT_S:.0f} s"
    if result["traceback"]:
        return result["traceback"]
    if "Traceback" in result["stderr"]:
        return result["stderr"]
    if result["rc"] not in (0, 1, 2):
        return f"exit {result['rc']}: {result['stderr'][-500:]}"
    return None


if __name__ == "__main__" and sys.argv[1:] == ["--worker"]:
    worker()
