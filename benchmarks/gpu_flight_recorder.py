"""Flight Recorder dumps on demand, on NCCL: `diag launch --on-hang dump,kill:5` over
torchrun running tests/programs/nccl_loop.py, whose last rank's GPU spins before
step 20's all_reduce. On the verdict diag writes every rank's
TORCH_NCCL_DEBUG_INFO_PIPE_FILE pipe; ProcessGroupNCCL's monitor thread dumps to
RUN_DIR/fr. Measured: when the verdict came, when each rank's dump landed, that
`diag analyze RUN_DIR` reads them, and that nothing is left on the GPU after the
kill.

    python benchmarks/gpu_flight_recorder.py --out DIR [--nproc 2 1]

Two ranks on one GPU are tried first: NCCL refuses two ranks on one device, and the
case then records that refusal; one rank per GPU needs as many GPUs as ranks.
Writes DIR/gpu_flight_recorder.json, each case's report.json and `diag analyze`'s
output; the run dirs stay in a temporary directory.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:   # run as a script: the repo's packages come from the repo
    sys.path.insert(0, REPO)

from diagnose.core.vocab import VerdictKind  # noqa: E402
PROGRAM = os.path.join(REPO, "tests", "programs", "nccl_loop.py")
HANG_STEP = 20
KILL_AFTER_S = 5
TIMEOUT_S = 150
CHILD_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
             "NVSHMEM_DISABLE_NVLS": "1"}


def read_lines(stream, lines: list[tuple[float, str]]) -> None:
    for line in stream:
        lines.append((time.time(), line.rstrip("\n")))


def gpu_apps() -> list[str]:
    done = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                           "--format=csv,noheader"], capture_output=True, text=True)
    return [line for line in done.stdout.splitlines() if line.strip()]


def last_records(fr_dir: str) -> dict:
    """Each dump's last three calls as diag reads them: group, op, seq, state."""
    from diagnose.offline.flight_recorder import FlightRecorderError, read_fr_dir
    try:
        run = read_fr_dir(fr_dir)
    except (FlightRecorderError, OSError) as error:
        return {"error": str(error)}
    return {str(rank): [f"{r.group} {r.op} #{r.seq} {r.state}" for r in state.collectives[-3:]]
            for rank, state in run.snapshot.ranks.items()}


def diag(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "diagnose.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def run_case(out: str, work: str, nproc: int, port: int) -> dict:
    run_dir = os.path.join(work, f"run-nproc{nproc}")
    env = dict(os.environ, **CHILD_ENV, NCCL_HANG=f"{nproc - 1}:{HANG_STEP}",
               PYTHONPATH=os.pathsep.join([REPO, os.path.dirname(PROGRAM),
                                           os.environ.get("PYTHONPATH", "")]))
    command = ["launch", "--run-dir", run_dir, "--on-hang", f"dump,kill:{KILL_AFTER_S}",
               "--mark", "nccl_steps:step", "--", sys.executable, "-m", "torch.distributed.run",
               "--nproc-per-node", str(nproc), "--master-port", str(port), PROGRAM]
    started = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "diagnose.cli", *command], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []
    reader = threading.Thread(target=read_lines, args=(proc.stderr, lines))
    reader.start()
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    reader.join()
    ended = time.time()
    verdict_at = next((at for at, line in lines if any(
        line.startswith(f"diag: {kind}: ") for kind in VerdictKind)), None)
    dumps = {os.path.basename(path): os.stat(path).st_mtime
             for path in glob.glob(os.path.join(run_dir, "fr", "fr_trace_rank_*"))}
    analyzed = diag("analyze", run_dir, "--json", env=env)
    shown = diag("analyze", run_dir, env=dict(env, COLUMNS="160"))
    try:
        recorded = json.loads(analyzed.stdout).get("flight_recorder") or {}
        recorded["verdicts"] = [{key: verdict[key] for key in ("kind", "culprit_ranks", "summary")}
                                for verdict in recorded.get("verdicts", [])]
    except ValueError:
        recorded = {"error": analyzed.stderr[-2000:]}
    with open(os.path.join(out, f"analyze-nproc{nproc}.txt"), "w") as f:
        f.write(f"$ diag analyze {run_dir}\n{shown.stdout}{shown.stderr}")
    if os.path.exists(os.path.join(run_dir, "report.json")):
        shutil.copy(os.path.join(run_dir, "report.json"),
                    os.path.join(out, f"report-nproc{nproc}.json"))
    return {"nproc": nproc, "command": "diag " + " ".join(command), "exit_code": code,
            "seconds": round(ended - started, 1),
            "verdict_after_start_s": None if verdict_at is None else round(verdict_at - started, 2),
            "dumps": sorted(dumps),
            "dumps_after_verdict_s": None if verdict_at is None or not dumps else
            {name: round(at - verdict_at, 2) for name, at in sorted(dumps.items())},
            "diag_exit_after_verdict_s": None if verdict_at is None else
            round(ended - verdict_at, 2),
            "analyze_exit_code": analyzed.returncode, "analyze_flight_recorder": recorded,
            "dump_last_records": last_records(os.path.join(run_dir, "fr")),
            "gpu_apps_after": gpu_apps(), "stderr_tail": [line for _, line in lines][-25:]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--nproc", type=int, nargs="+", default=[2, 1])
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    import torch
    result = {"gpu": torch.cuda.get_device_name(), "gpus": torch.cuda.device_count(),
              "torch": torch.__version__,
              "nccl": ".".join(map(str, torch.cuda.nccl.version())), "cases": []}
    work = tempfile.mkdtemp(prefix="gpu_fr_")
    for index, nproc in enumerate(args.nproc):
        case = run_case(args.out, work, nproc, 29511 + index)
        result["cases"].append(case)
        print(json.dumps({k: v for k, v in case.items() if k != "stderr_tail"}), flush=True)
        with open(os.path.join(args.out, "gpu_flight_recorder.json"), "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
