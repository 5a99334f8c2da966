"""GPU diagnostics on 2 GPUs with NCCL: injected faults and the verdicts they get.

The engine runs under `diag launch` with one injected fault per run; beside
those runs, PyTorch's Flight Recorder on the same fault, the probe's cost per
traced call, and engine tokens/s with the probe on and off.

    python benchmarks/gpu_diag.py --out DIR [--only CASE ...] [--budget-s SECONDS]

Cases, in the order they run (--list prints them with their expected time):

  probe_cost          per traced collective and per graph replay: the probe's CUDA
                      events against the host-mapped counter (kernels/progress.py)
  device_assert       tp=2, rank 1 fails a device-side assert; --relaunch-on-cuda-error
                      must name the kernel and its Python call site
  graph_gpu_spin      tp=2, CUDA graphs on: rank 1's GPU spins before a decode replay;
                      gpu_stuck must name a collective inside the replay
  graph_hang          tp=2, CUDA graphs on: rank 1's host hangs at a decode step; rank 0
                      is shown waiting in a collective inside its replay
  pp2_*               the fault matrix at pp=2 (tp=1): hang before execute_model, hang
                      in forward, a rank that stops taking the broadcast, a crash, and
                      stage 0 skipping its pp send
  flight_recorder     rank 1 skips an all_reduce at tp=2: this toolkit's verdict vs
                      PyTorch's Flight Recorder + fr_trace with a 20 s process-group timeout
  overhead            engine output tokens/s, probe on vs off, tp=2, llama-3.2-1b (dummy
                      bf16), CUDA graphs on, alternating rounds
  tp2_*               the tp=2 matrix measured before (gpu_spin, hang, skip, crash), eager
  multinode_pp2       two "nodes" (one diag launch each, one GPU each), pp=2 across them
                      on NCCL; rank 1, on node 1, hangs before its first execute_model:
                      the head must name it

Every case prints a progress line with the time since the start, and DIR/gpu_diag.json
is rewritten after each case, so a run that is cut short still says what it found.
A case whose expected time no longer fits in --budget-s is skipped, and said so.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:   # run as a script: the repo's packages come from the repo
    sys.path.insert(0, REPO)
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1",
             "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
WORK_DIR = os.path.join(tempfile.gettempdir(), "gpu_diag")
PROMPTS = ["--prompt", "Where does the GPU stop?", "--prompt", "Which rank is late?"]
DETECT_LIMIT_S = 5.0
LAUNCH_TIMEOUT_S = 150
SKIP_ALL_REDUCE = "rank=1,at=forward,step=4,kind=skip_collective"
FR_TIMEOUT_S = 20
FR_WAIT_S = 75           # after the fault: the timeout, the dumps, the watchdog's abort
ENGINE_TIMEOUT_DEFAULT_S = 1800   # engine/communicator.py DEFAULT_TIMEOUT_S (torch's NCCL default: 600)
OVERHEAD_MODEL = "llama-3.2-1b"
OVERHEAD_PROMPTS = 64
OVERHEAD_TOKENS = 192
OVERHEAD_REPEATS = 3
REPLAY_CALLS = 33        # a llama-3.2-1b decode replay at tp=2: 16 layers x 2 + the embedding


def engine(tp: int, pp: int, eager: bool = True) -> list[str]:
    return ([sys.executable, "-m", "engine", "generate", "--model", "tiny-llama",
             "-tp", str(tp), "-pp", str(pp), "--device", "cuda", "--dtype", "bfloat16",
             "--ignore-eos", "--max-tokens", "32", *PROMPTS]
            + (["--enforce-eager"] if eager else []))


class Clock:
    def __init__(self, budget_s: float):
        self.start = time.time()
        self.budget_s = budget_s

    def elapsed(self) -> float:
        return time.time() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def say(self, text: str) -> None:
        print(f"[{self.elapsed():6.1f} s] {text}", flush=True)


# -- faults under diag launch ---------------------------------------------------------

@dataclass
class FaultCase:
    name: str
    tp: int
    pp: int
    fault: str
    expected: tuple[str, list[int]]
    eager: bool = True
    flags: list[str] = field(default_factory=list)
    check: object = None     # (row, report, run_dir) -> list of problems


def launch(case: FaultCase, out_dir: str, timeout: float) -> tuple[dict, str, dict]:
    """Runs the case under diag launch; (its report, run dir, what the run gave)."""
    run_dir = os.path.join(WORK_DIR, case.name)
    shutil.rmtree(run_dir, ignore_errors=True)   # a stale run dir would be read as this run's
    report_path = os.path.join(out_dir, f"{case.name}.report.json")
    if os.path.exists(report_path):
        os.remove(report_path)
    cmd = [sys.executable, "-m", "diagnose.cli", "launch", "--on-hang", "kill",
           "--run-dir", run_dir, "-o", report_path, "--fault", case.fault,
           *case.flags, "--", *engine(case.tp, case.pp, case.eager)]
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as error:
        code, stderr = "timeout", _text(error.stderr)
    report = {}
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    return report, run_dir, {"exit_code": code, "wall_s": round(time.time() - start, 1),
                             "stderr_tail": stderr[-4000:]}


def run_fault_case(case: FaultCase, out_dir: str, clock: Clock) -> dict:
    report, run_dir, ran = launch(case, out_dir, min(LAUNCH_TIMEOUT_S, max(clock.left(), 30)))
    verdicts = report.get("verdicts", [])
    first = verdicts[0] if verdicts else {}
    row = {"case": case.name, "layout": f"tp={case.tp} pp={case.pp}",
           "graphs": not case.eager, "fault": case.fault, "expected": list(case.expected),
           "got": [[v["kind"], v["culprit_ranks"]] for v in verdicts],
           "detected_after_s": first.get("detected_after_s"), "summary": first.get("summary"),
           "victims": first.get("victim_ranks"), "exit_code": ran["exit_code"],
           "wall_s": ran["wall_s"], "problems": []}
    if not row["got"] or row["got"][0] != list(case.expected):
        row["problems"].append(f"expected {case.expected}, got {row['got'][:2]}")
    if (row["detected_after_s"] or 0) > DETECT_LIMIT_S:
        row["problems"].append(f"detected after {row['detected_after_s']} s > {DETECT_LIMIT_S} s")
    if case.check and verdicts:
        row["problems"] += case.check(row, report, run_dir)
    row["ok"] = not row["problems"]
    if not row["ok"]:
        row["stderr_tail"] = ran["stderr_tail"]
    return row


def check_device_assert(row: dict, report: dict, run_dir: str) -> list[str]:
    """The relaunch names the kernel and its Python call site; the first run, a later call."""
    body = report.get("cuda_error")
    if body is None:
        return ["no cuda_error section in the report (no relaunch)"]
    row["cuda_error"] = body
    first, blocking = body["first_run"], body["launch_blocking_run"]
    problems = []
    if not (blocking["site"] or "").startswith("kernels/faults.py"):
        problems.append(f"blocking run's site is {blocking['site']!r}, not the fault kernel's launch")
    if "_assert_kernel" not in (blocking["code"] or "") or not body["kernel"]:
        problems.append(f"kernel {body['kernel']!r}, launch line {blocking['code']!r}")
    if first["site"] == blocking["site"]:
        problems.append("the first run names the same site as the blocking run")
    return problems


def check_replay_position(row: dict, report: dict, run_dir: str) -> list[str]:
    """The device position is a collective inside the replay (an all_reduce the graph
    holds), not the eager all_gather of the LM head that follows it."""
    verdict = report["verdicts"][0]
    stuck = (verdict.get("evidence", {}).get("device") or {}).get("not_reached")
    if stuck is None:           # graph_hang: the victim's record is the position
        stuck = _record(run_dir, 0, verdict.get("group"), verdict.get("seq"))
    row["device_position"] = stuck and {key: stuck[key] for key in
                                        ("group", "op", "seq", "site", "t_device_start")}
    if stuck is None:
        return [f"no record at {verdict.get('group')} seq {verdict.get('seq')}"]
    if stuck["op"] != "all_reduce" or not stuck["site"].startswith(("model/linear.py",
                                                                     "model/embed_head.py")):
        return [f"device position {stuck['op']} at {stuck['site']} is not inside the replay"]
    if verdict["kind"] == "stuck_in_phase" and stuck["t_device_start"] is None:
        return ["rank 0's GPU is not seen inside its replay"]
    return []


def _record(run_dir: str, rank: int, group: str | None, seq: int | None) -> dict | None:
    from dataclasses import asdict
    from diagnose.launch.collector import Collector
    state = Collector(run_dir).snapshot().ranks.get(rank)
    for record in state.collectives if state else []:
        if (record.group, record.seq) == (group, seq):
            return asdict(record)
    return None


def fault_fired_at(run_dir: str, rank: int) -> float | None:
    from diagnose.launch.collector import Collector
    state = Collector(run_dir).snapshot().ranks.get(rank)
    return state.fault.fired_at if state is not None and state.fault is not None else None


FAULT_CASES = [
    FaultCase("device_assert", 2, 1, "rank=1,at=forward,step=4,kind=device_assert",
              ("dead", [1]), flags=["--relaunch-on-cuda-error"], check=check_device_assert),
    FaultCase("graph_gpu_spin", 2, 1, "rank=1,at=forward,step=4,kind=gpu_spin",
              ("gpu_stuck", [1]), eager=False, check=check_replay_position),
    FaultCase("graph_hang", 2, 1, "rank=1,at=forward,step=4,kind=hang",
              ("stuck_in_phase", [1]), eager=False, check=check_replay_position),
    FaultCase("pp2_hang_before_execute_model", 1, 2, "rank=1,at=execute_model,step=0,kind=hang",
              ("never_reached", [1])),
    FaultCase("pp2_hang_in_forward", 1, 2, "rank=0,at=forward,step=5,kind=hang",
              ("stuck_in_phase", [0])),
    FaultCase("pp2_skip_broadcast", 1, 2, "rank=1,at=dequeue,step=6,kind=skip_broadcast",
              ("broadcast_not_consumed", [1])),
    FaultCase("pp2_crash", 1, 2, "rank=1,at=execute_model,step=3,kind=crash", ("dead", [1])),
    FaultCase("pp2_skip_send", 1, 2, "rank=0,at=forward,step=4,kind=skip_collective",
              ("collective_missing_peers", [0])),
    FaultCase("tp2_gpu_spin", 2, 1, "rank=1,at=forward,step=4,kind=gpu_spin", ("gpu_stuck", [1])),
    FaultCase("tp2_hang_before_execute_model", 2, 1, "rank=1,at=execute_model,step=0,kind=hang",
              ("never_reached", [1])),
    FaultCase("tp2_skip_collective", 2, 1, SKIP_ALL_REDUCE, ("collective_mismatch", [1])),
    FaultCase("tp2_crash", 2, 1, "rank=1,at=execute_model,step=3,kind=crash", ("dead", [1])),
]


# -- this toolkit vs PyTorch's Flight Recorder on one fault ---------------------------

def flight_recorder_case(out_dir: str, clock: Clock) -> dict:
    """Rank 1 skips an all_reduce at tp=2. This toolkit: the time from the fault to
    its report. Flight Recorder: the engine alone with a 20 s process-group timeout,
    the time from the fault to the dumps, then fr_trace over them."""
    ours = FaultCase("flight_recorder_toolkit", 2, 1, SKIP_ALL_REDUCE, ("collective_mismatch", [1]))
    report, run_dir, ran = launch(ours, out_dir, min(LAUNCH_TIMEOUT_S, max(clock.left(), 30)))
    fired = fault_fired_at(run_dir, 1)
    report_path = os.path.join(out_dir, f"{ours.name}.report.json")
    verdicts = report.get("verdicts", [])
    toolkit = {"got": [[v["kind"], v["culprit_ranks"]] for v in verdicts],
               "verdict": verdicts[0]["summary"] if verdicts else None,
               "seconds_to_report": (round(os.path.getmtime(report_path) - fired, 2)
                                     if fired and verdicts else None),
               "wall_s": ran["wall_s"]}
    clock.say(f"  toolkit: {toolkit['got'][:1]} {toolkit['seconds_to_report']} s after the fault")
    torch_fr = flight_recorder_run(out_dir, clock)
    row = {"case": "flight_recorder", "fault": SKIP_ALL_REDUCE, "toolkit": toolkit,
           "flight_recorder_20s": torch_fr,
           "flight_recorder_default": {
               "measured": False, "lower_bound_s": ENGINE_TIMEOUT_DEFAULT_S,
               "note": f"not run: Flight Recorder dumps only when the process-group timeout "
                       f"fires, {ENGINE_TIMEOUT_DEFAULT_S} s by default in this engine (600 s "
                       f"in torch for NCCL), beyond this run's budget; the time to its "
                       f"verdict is at least that, a documented lower bound, not a measurement"}}
    problems = []
    if toolkit["got"][:1] != [["collective_mismatch", [1]]]:
        problems.append(f"toolkit: expected collective_mismatch [1], got {toolkit['got'][:2]}")
    if not torch_fr.get("dumps"):
        problems.append("no Flight Recorder dump")
    row["problems"], row["ok"] = problems, not problems
    if toolkit["seconds_to_report"] and torch_fr.get("seconds_to_verdict"):
        row["speedup"] = round(torch_fr["seconds_to_verdict"] / toolkit["seconds_to_report"], 1)
    return row


def flight_recorder_run(out_dir: str, clock: Clock) -> dict:
    work = os.path.join(WORK_DIR, "flight_recorder")
    shutil.rmtree(work, ignore_errors=True)
    dumps, run_dir = os.path.join(work, "dumps"), os.path.join(work, "run")
    os.makedirs(dumps)
    prefix = os.path.join(dumps, "nccl_trace_rank_")
    env = {**os.environ, "DIAG_RUN_DIR": run_dir, "DIAG_FAULT": SKIP_ALL_REDUCE,
           "ENGINE_DIST_TIMEOUT_S": str(FR_TIMEOUT_S),
           "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_FR_BUFFER_SIZE": "2000",
           "TORCH_NCCL_DUMP_ON_TIMEOUT": "1", "TORCH_NCCL_ENABLE_MONITORING": "1",
           "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, "TORCH_FR_DUMP_TEMP_FILE": prefix}
    log_path = os.path.join(out_dir, "flight_recorder.engine.log")
    start = time.time()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(engine(2, 1), env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True, cwd=REPO)
        deadline = start + min(FR_WAIT_S + 40, max(clock.left() - 20, 30))
        try:
            _wait_for_dumps(proc, dumps, deadline)
        finally:
            _end_session(proc)
    fired = fault_fired_at(run_dir, 1)
    files = sorted(glob.glob(prefix + "*"))
    result = {"timeout_s": FR_TIMEOUT_S, "engine_exit": proc.returncode,
              "dumps": [os.path.basename(path) for path in files],
              "engine_log_tail": _tail(log_path, 30)}
    if not files or fired is None:
        return result
    dumped = max(os.path.getmtime(path) for path in files)
    result["seconds_to_dumps"] = round(dumped - fired, 2)
    trace = _run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", dumps,
                  "--prefix", os.path.basename(prefix)], timeout=min(120, max(clock.left(), 10)))
    with open(os.path.join(out_dir, "flight_recorder.fr_trace.txt"), "w") as f:
        f.write(trace["output"])
    result["fr_trace"] = {"exit_code": trace["exit_code"], "seconds": trace["seconds"],
                          "output_tail": trace["output"].splitlines()[-40:]}
    result["seconds_to_verdict"] = round(result["seconds_to_dumps"] + trace["seconds"], 2)
    ours = _run([sys.executable, "-m", "diagnose.cli", "analyze", dumps, "--json"],
                timeout=min(60, max(clock.left(), 10)))
    try:
        result["diag_analyze_on_dumps"] = [[v["kind"], v["culprit_ranks"], v["summary"]]
                                           for v in json.loads(ours["output"])["verdicts"]]
    except (ValueError, KeyError):
        result["diag_analyze_on_dumps"] = ours["output"][-2000:]
    return result


def _wait_for_dumps(proc: subprocess.Popen, dumps: str, deadline: float) -> None:
    """Until the engine ends, or both ranks' dumps are there and stopped growing."""
    sizes = None
    while time.time() < deadline and proc.poll() is None:
        files = sorted(glob.glob(os.path.join(dumps, "*")))
        now = [(path, os.path.getsize(path)) for path in files]
        if len(files) >= 2 and now == sizes:
            return
        sizes = now
        time.sleep(2.0)


def _end_session(proc: subprocess.Popen) -> None:
    """The engine and its workers share the session it leads."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _run(cmd: list[str], timeout: float) -> dict:
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
        code, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as error:
        code, output = "timeout", _text(error.stdout) + _text(error.stderr)
    return {"exit_code": code, "output": output, "seconds": round(time.time() - start, 2)}


def _tail(path: str, lines: int) -> list[str]:
    with open(path, errors="replace") as f:
        return f.read().splitlines()[-lines:]


def _text(raw) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else (raw or "")


# -- the probe's cost: CUDA events vs the host-mapped counter ----------------------------

def probe_cost_case(out_dir: str, clock: Clock) -> dict:
    path = os.path.join(out_dir, "probe_cost.json")
    ran = _run([sys.executable, os.path.abspath(__file__), "--probe-cost-worker", path],
               timeout=min(180, max(clock.left(), 30)))
    if not os.path.exists(path):
        return {"case": "probe_cost", "ok": False, "problems": ["the measurement did not finish"],
                "output_tail": ran["output"][-3000:]}
    with open(path) as f:
        row = {"case": "probe_cost", **json.load(f)}
    row["problems"] = []
    row["ok"] = True
    return row


def measure_probe_cost(path: str) -> None:
    """In a process of its own, the probe on, one GPU: microseconds per traced
    collective and per graph replay of REPLAY_CALLS collectives, with the two CUDA
    events the probe records, and with two writes of the host-mapped counter."""
    import torch
    from diagnose import probe
    from kernels.progress import write_counter

    os.environ[probe.RUN_DIR_VAR] = os.path.join(WORK_DIR, "probe_cost_run")
    shutil.rmtree(os.environ[probe.RUN_DIR_VAR], ignore_errors=True)
    torch.cuda.set_device(0)
    probe.init("worker", rank=0, world_size=1, device="cuda:0")
    tensor = torch.zeros(16, 2048, device="cuda")
    counter = torch.zeros(1, dtype=torch.int64, pin_memory=True)
    start, end = torch.cuda.Event(), torch.cuda.Event()
    write_counter(counter, 0)     # compiles the kernel
    with probe.graph_capture() as graph:
        for _ in range(REPLAY_CALLS):
            with probe.collective("tp0", "all_reduce", [tensor]):
                pass

    def events(n):
        for _ in range(n):
            start.record()
            end.record()

    def counters(n):
        for i in range(n):
            write_counter(counter, 2 * i)
            write_counter(counter, 2 * i + 1)

    def traced(n):
        for _ in range(n):
            with probe.collective("tp0", "all_reduce", [tensor]):
                pass

    def replays(n):
        for _ in range(n):
            with probe.graph_replay(graph):
                pass

    def empty(n):
        for _ in range(n):
            pass

    def us_per_call(body, n=2000) -> float:
        best = float("inf")
        for _ in range(5):
            torch.cuda.synchronize()
            begin = time.perf_counter()
            body(n)
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - begin) / n)
        return best * 1e6

    loop = us_per_call(empty)
    cost = {name: round(us_per_call(body) - loop, 2) for name, body in
            (("event_pair_us", events), ("counter_pair_us", counters),
             ("traced_collective_us", traced), ("replay_us", replays))}
    cost["replay_calls"] = REPLAY_CALLS
    records = cost["replay_us"] - cost["event_pair_us"]
    cost["per_replay"] = {"events_us": cost["replay_us"],
                          "counter_us": round(records + cost["counter_pair_us"], 2)}
    cost["per_traced_collective"] = {
        "events_us": cost["traced_collective_us"],
        "counter_us": round(cost["traced_collective_us"] - cost["event_pair_us"]
                            + cost["counter_pair_us"], 2)}
    cost["kept"] = "events"
    with open(path, "w") as f:
        json.dump(cost, f, indent=1)


# -- engine tokens/s with the probe on and off --------------------------------------------

def overhead_case(out_dir: str, clock: Clock, rounds: int) -> dict:
    """Rounds alternate off, on, off, on, ...; each round is a fresh engine."""
    off, on, failures = [], [], []
    for index in range(rounds):
        for probe_on, results in ((False, off), (True, on)):
            if clock.left() < 60:
                failures.append(f"round {index}: out of budget")
                break
            value = overhead_round(out_dir, probe_on, clock)
            label = "on " if probe_on else "off"
            clock.say(f"  overhead round {index} probe {label}: {value}")
            if isinstance(value, float):
                results.append(value)
            else:
                failures.append(f"round {index} probe {label}: {value}")
    row = {"case": "overhead", "model": OVERHEAD_MODEL, "tp": 2, "dtype": "bfloat16",
           "cuda_graphs": True, "prompts": OVERHEAD_PROMPTS, "max_tokens": OVERHEAD_TOKENS,
           "tokens_per_s_off": off, "tokens_per_s_on": on, "problems": failures}
    if off and on:
        row["ratio_on_off"] = round(statistics.median(on) / statistics.median(off), 4)
        row["round_ratios"] = [round(b / a, 4) for a, b in zip(off, on)]
    row["ok"] = bool(off and on) and not failures
    return row


def overhead_round(out_dir: str, probe_on: bool, clock: Clock) -> float | str:
    path = os.path.join(out_dir, "overhead_round.json")
    if os.path.exists(path):
        os.remove(path)
    env = {key: value for key, value in os.environ.items() if key != "DIAG_RUN_DIR"}
    run_dir = os.path.join(WORK_DIR, "overhead_run")
    if probe_on:
        shutil.rmtree(run_dir, ignore_errors=True)
        env["DIAG_RUN_DIR"] = run_dir
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, os.path.abspath(__file__),
                               "--overhead-worker", path], env=env, capture_output=True,
                              text=True, timeout=min(150, max(clock.left() - 10, 30)), cwd=REPO)
        output = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as error:
        output = "timeout " + _text(error.stderr)[-500:]
    if not os.path.exists(path):
        return f"failed after {time.time() - start:.0f} s: {output[-800:]}"
    with open(path) as f:
        return statistics.median(json.load(f)["tokens_per_s"])


def measure_tokens_per_s(path: str) -> None:
    """One engine: a warm-up batch, then the same batch OVERHEAD_REPEATS times."""
    from engine.entrypoints.llm import LLM
    from engine.sampling_params import SamplingParams

    prompts = [f"Request {i}: where does the time of a decode step go?"
               for i in range(OVERHEAD_PROMPTS)]
    params = SamplingParams(temperature=0.0, max_tokens=OVERHEAD_TOKENS, ignore_eos=True)
    rates = []
    with LLM(OVERHEAD_MODEL, load_format="dummy", dtype="bfloat16", device="cuda",
             tensor_parallel_size=2, max_num_seqs=OVERHEAD_PROMPTS) as llm:
        llm.generate(prompts[:8], SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
        for _ in range(OVERHEAD_REPEATS):
            start = time.perf_counter()
            outputs = llm.generate(prompts, params)
            rates.append(sum(len(o.token_ids) for o in outputs) / (time.perf_counter() - start))
    with open(path, "w") as f:
        json.dump({"tokens_per_s": rates}, f)


# -- two nodes on one machine ------------------------------------------------------------

MULTINODE_FAULT = "rank=1,at=execute_model,step=0,kind=hang"


def multinode_case(out_dir: str, clock: Clock) -> dict:
    """The head (node 0: the driver and rank 0 on GPU 0) and node 1 (rank 1 on GPU 1),
    each under its own diag launch; the fault is given to node 1's launch only."""
    master, listen = 29700, 29710   # the rendezvous takes master and master + 1
    report_path = os.path.join(out_dir, "multinode_pp2.report.json")
    env = dict(os.environ, DIAG_NODE_TOKEN="gpu-diag-multinode",
               ENGINE_NODE_TOKEN="gpu-diag-engine-link")
    procs = []
    for node in (0, 1):
        flags = (["--listen", f"127.0.0.1:{listen}", "--on-hang", "kill",
                  "-o", report_path] if node == 0 else
                 ["--head", f"127.0.0.1:{listen}", "--fault", MULTINODE_FAULT])
        command = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir",
                   os.path.join(WORK_DIR, f"multinode-{node}"), "--nnodes", "2",
                   "--node-rank", str(node), *flags, "--", *engine(1, 2), "--nnodes", "2",
                   "--node-rank", str(node), "--master-port", str(master)]
        node_env = dict(env, CUDA_VISIBLE_DEVICES=str(node))
        procs.append(subprocess.Popen(command, cwd=REPO, env=node_env, text=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
    start = time.time()
    codes = []
    for proc in procs:
        try:
            proc.wait(timeout=max(LAUNCH_TIMEOUT_S - (time.time() - start), 1))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        codes.append(proc.returncode)
    report = {}
    if os.path.exists(report_path):
        with open(report_path) as f:
            report = json.load(f)
    verdicts = report.get("verdicts", [])
    first = verdicts[0] if verdicts else {}
    row = {"case": "multinode_pp2", "layout": "pp=2 over 2 nodes (1 GPU each)",
           "fault": f"node 1: {MULTINODE_FAULT}", "expected": ["never_reached", [1]],
           "got": [[v["kind"], v["culprit_ranks"]] for v in verdicts],
           "detected_after_s": first.get("detected_after_s"), "summary": first.get("summary"),
           "exit_codes": codes, "wall_s": round(time.time() - start, 1), "problems": []}
    if not row["got"] or row["got"][0] != row["expected"]:
        row["problems"].append(f"expected {row['expected']}, got {row['got'][:2]}")
    if (row["detected_after_s"] or 0) > DETECT_LIMIT_S:
        row["problems"].append(f"detected after {row['detected_after_s']} s")
    row["ok"] = not row["problems"]
    return row


# -- the run ----------------------------------------------------------------------------

@dataclass
class Case:
    name: str
    expected_s: float
    run: object   # (out_dir, clock) -> row


def all_cases(overhead_rounds: int) -> list[Case]:
    estimates = {"device_assert": 35, "graph_gpu_spin": 30, "graph_hang": 30}
    fault_cases = [Case(case.name, estimates.get(case.name, 22),
                        lambda out, clock, case=case: run_fault_case(case, out, clock))
                   for case in FAULT_CASES]
    new = [case for case in fault_cases if not case.name.startswith("tp2_")]
    old = [case for case in fault_cases if case.name.startswith("tp2_")]
    return ([Case("probe_cost", 30, probe_cost_case)] + new
            + [Case("flight_recorder", 80, flight_recorder_case),
               Case("overhead", 25 * 2 * overhead_rounds,
                    lambda out, clock: overhead_case(out, clock, overhead_rounds))]
            + old + [Case("multinode_pp2", 30, multinode_case)])


def print_row(clock: Clock, row: dict) -> None:
    status = "ok" if row.get("ok") else "SKIPPED" if row.get("skipped") else "FAIL"
    if "got" in row:
        got = row["got"][0] if row["got"] else "no verdict"
        detected = row["detected_after_s"]
        clock.say(f"{row['case']:<30} {status:<5} {got!s:<28} detected after "
                  f"{'-' if detected is None else f'{detected:.2f} s'}  ({row['wall_s']} s wall)")
        clock.say(f"    {row['summary']}")
    else:
        clock.say(f"{row['case']:<30} {status}")
    for key in ("device_position", "cuda_error", "per_traced_collective", "per_replay",
                "toolkit", "flight_recorder_20s", "flight_recorder_default", "speedup",
                "ratio_on_off", "round_ratios", "skipped"):
        if key in row:
            text = json.dumps(row[key], default=str)
            clock.say(f"    {key}: {text[:1500]}")
    trace = row.get("flight_recorder_20s", {}).get("fr_trace")
    if trace:
        clock.say("    fr_trace says:")
        for line in trace["output_tail"][-15:]:
            clock.say(f"      {line}")
    for problem in row.get("problems", []):
        clock.say(f"    problem: {problem}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".", help="where gpu_diag.json and the reports go")
    parser.add_argument("--only", action="append", metavar="CASE",
                        help="run only these cases (repeatable; a name ending in * is a prefix)")
    parser.add_argument("--budget-s", type=float, default=560.0,
                        help="wall-clock budget of the whole run (default 560)")
    parser.add_argument("--overhead-rounds", type=int, default=3)
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--probe-cost-worker", metavar="JSON", help=argparse.SUPPRESS)
    parser.add_argument("--overhead-worker", metavar="JSON", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe_cost_worker:
        return measure_probe_cost(args.probe_cost_worker)
    if args.overhead_worker:
        return measure_tokens_per_s(args.overhead_worker)
    cases = all_cases(args.overhead_rounds)
    if args.list:
        for case in cases:
            print(f"{case.name:<32} ~{case.expected_s:.0f} s")
        return
    chosen = [case for case in cases if not args.only or any(
        case.name == name or (name.endswith("*") and case.name.startswith(name[:-1]))
        for name in args.only)]
    unknown = [name for name in args.only or [] if not any(
        case.name == name or (name.endswith("*") and case.name.startswith(name[:-1]))
        for case in cases)]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; --list shows them")
    os.environ.update(CHILD_ENV)
    os.makedirs(args.out, exist_ok=True)
    clock = Clock(args.budget_s)
    clock.say(f"{len(chosen)} cases, about {sum(c.expected_s for c in chosen):.0f} s, "
              f"budget {args.budget_s:.0f} s; results in {os.path.join(args.out, 'gpu_diag.json')}")
    rows = []
    for case in chosen:
        if case.expected_s > clock.left():
            row = {"case": case.name, "ok": False,
                   "skipped": f"needs about {case.expected_s:.0f} s, {clock.left():.0f} s left"}
        else:
            clock.say(f"{case.name}: starting (about {case.expected_s:.0f} s)")
            row = case.run(args.out, clock)
        rows.append(row)
        with open(os.path.join(args.out, "gpu_diag.json"), "w") as f:
            json.dump(rows, f, indent=1, default=str)
        print_row(clock, row)
    passed = sum(1 for row in rows if row.get("ok"))
    clock.say(f"done: {passed} of {len(rows)} cases ok")


if __name__ == "__main__":
    main()
