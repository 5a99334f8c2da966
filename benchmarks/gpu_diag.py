"""GPU diagnostics at tp=2 on 2 GPUs with NCCL: the engine under `diag launch`,
one injected fault per run, and the verdict each gets.

    python benchmarks/gpu_diag.py --out DIR

Cases: the CPU fault matrix's tp=2 cases (hang before execute_model, a skipped
all-reduce, a crash, all on rank 1), gpu_spin on rank 1 (expects gpu_stuck),
and device_assert on rank 1 with --relaunch-on-cuda-error. Writes
gpu_diag.json in DIR and prints a table.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ENGINE = [sys.executable, "-m", "engine", "generate", "--model", "tiny-llama", "-tp", "2",
          "--device", "cuda", "--dtype", "bfloat16", "--enforce-eager", "--ignore-eos",
          "--max-tokens", "32", "--prompt", "Where does the GPU stop?",
          "--prompt", "Which rank is late?"]

CASES = [  # name, fault, expected (kind, culprits), extra launch flags
    ("gpu_spin", "rank=1,at=forward,step=4,kind=gpu_spin", ("gpu_stuck", [1]), []),
    ("device_assert", "rank=1,at=forward,step=4,kind=device_assert", ("dead", [1]),
     ["--relaunch-on-cuda-error"]),
    ("hang_before_execute_model", "rank=1,at=execute_model,step=0,kind=hang",
     ("never_reached", [1]), []),
    ("skip_collective", "rank=1,at=forward,step=4,kind=skip_collective",
     ("collective_mismatch", [1]), []),
    ("crash", "rank=1,at=execute_model,step=3,kind=crash", ("dead", [1]), []),
]


def run_case(out_dir: str, name: str, fault: str, flags: list[str]) -> dict:
    run_dir = os.path.join(tempfile.gettempdir(), "gpu_diag", name)
    shutil.rmtree(run_dir, ignore_errors=True)  # a stale run dir would be read as this run's
    report = os.path.join(out_dir, f"{name}.report.json")
    cmd = [sys.executable, "-m", "diagnose.cli", "launch", "--on-hang", "kill",
           "--run-dir", run_dir, "--json-report", report, "--fault", fault, *flags,
           "--", *ENGINE]
    start = time.time()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=150)
        code, stderr = proc.returncode, proc.stderr
    except subprocess.TimeoutExpired as error:
        code, stderr = "timeout", (error.stderr or b"").decode("utf-8", "replace")
    body = {}
    if os.path.exists(report):
        with open(report) as f:
            body = json.load(f)
    return {"exit_code": code, "wall_s": round(time.time() - start, 1),
            "report": body, "stderr_tail": stderr[-4000:]}


def summarize(name: str, expected: tuple, result: dict) -> dict:
    verdicts = result["report"].get("verdicts", [])
    got = [(v["kind"], v["culprit_ranks"]) for v in verdicts]
    first = verdicts[0] if verdicts else {}
    row = {"case": name, "expected": list(expected), "got": got,
           "ok": bool(got) and got[0] == expected,
           "detected_after_s": first.get("detected_after_s"),
           "summary": first.get("summary"), "victims": first.get("victim_ranks"),
           "exit_code": result["exit_code"], "wall_s": result["wall_s"]}
    if "cuda_error" in result["report"]:
        row["cuda_error"] = result["report"]["cuda_error"]
    if not row["ok"]:
        row["stderr_tail"] = result["stderr_tail"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--only", action="append", help="run only these cases")
    args = parser.parse_args()
    rows = []
    for name, fault, expected, flags in CASES:
        if args.only and name not in args.only:
            continue
        rows.append(summarize(name, expected, run_case(args.out, name, fault, flags)))
        with open(os.path.join(args.out, "gpu_diag.json"), "w") as f:
            json.dump(rows, f, indent=1)
        row = rows[-1]
        print(f"{name:<28}{'ok' if row['ok'] else 'FAIL':<6}{row['got']!s:<40}"
              f"{row['detected_after_s']!s:>8} s  {row['wall_s']} s wall", flush=True)
        print(f"    {row['summary']}", flush=True)
        if "cuda_error" in row:
            print(f"    cuda_error: {json.dumps(row['cuda_error'])[:1500]}", flush=True)


if __name__ == "__main__":
    main()
