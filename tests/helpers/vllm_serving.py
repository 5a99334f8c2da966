"""Real vLLM (its CPU build, in .venv-vllm: ./setup.sh --tests) serving a tiny
Llama, with or without `diag launch` around it, for the tests and benchmarks.

Every server gets a private TMPDIR; the compile caches are shared by the
servers of one session so that only the first one compiles cold. vLLM 0.32 on
torch 2.13 (CPU) cannot load the AOT-compiled artifacts it saves ("'function'
object has no attribute 'finalize_loading'") and compiles again at every start,
so the servers run with VLLM_USE_AOT_COMPILE=0: still torch.compile, with the
older cache, which loads (a warm tp=2 start here: 67 s to ready, against 87 s)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from diagnose.launch.leftovers import SharedMemoryTracker
from helpers.run import DIAG, free_port

REPO = Path(__file__).resolve().parents[2]
# Another vLLM's venv (.ci/run sets it for the oldest release, benchmarks/vllm_matrix.py
# for each of its releases). A venv named so is wanted: without a working vLLM there,
# its tests fail with the reason (tests/conftest.py) instead of skipping.
VENV_VAR = "HANGSCOPE_VLLM_VENV"
VENV_NAMED = bool(os.environ.get(VENV_VAR))
VLLM = (Path(os.environ.get(VENV_VAR) or REPO / ".venv-vllm") / "bin" / "vllm").absolute()
MAKE_CHECKPOINT = REPO / "tests" / "vllm_env" / "make_tiny_llama.py"
READY_TIMEOUT_S = float(os.environ.get("HANGSCOPE_VLLM_READY_S", 420))   # a cold compile on a
                               # loaded 2-core machine; benchmarks/vllm_matrix.py may give more
BIND = {1: "0|1", 2: "0|1", 4: "0|1|0|1"}   # VLLM_CPU_OMP_THREADS_BIND by world size
PROMPT = "The capital of France is"


def vllm_missing() -> bool:
    """Whether the vLLM tests skip: no vLLM here, and none was asked for."""
    return not VENV_NAMED and not VLLM.exists()


def import_error(*modules: str) -> str | None:
    """None when the venv's Python imports the modules; else why not (the last line
    of its error)."""
    python = VLLM.parent / "python"
    if not python.exists():
        return f"{python} does not exist"
    done = subprocess.run([str(python), "-c", f"import {', '.join(modules)}"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode == 0:
        return None
    lines = done.stderr.strip().splitlines() or [f"exit code {done.returncode}"]
    return f"{python} cannot import {', '.join(modules)}: {lines[-1]}"


def make_checkpoint(out: Path) -> Path:
    subprocess.run([sys.executable, str(MAKE_CHECKPOINT), str(out)], check=True, cwd=REPO,
                   timeout=300)
    return out


def vllm_env(cache: Path, tmp: str, world_size: int) -> dict[str, str]:
    return dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1",
                VLLM_CPU_OMP_THREADS_BIND=BIND[world_size], HF_HUB_OFFLINE="1",
                TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
                TMPDIR=tmp, VLLM_CACHE_ROOT=str(cache / "vllm"),
                TORCHINDUCTOR_CACHE_DIR=str(cache / "inductor"),
                TRITON_CACHE_DIR=str(cache / "triton"), HF_HOME=str(cache / "hf"),
                VLLM_USE_AOT_COMPILE="0", PYTHONUNBUFFERED="1")


def launch_vllm(work: Path, checkpoint: Path, cache: Path, tp: int = 2, pp: int = 1,
                diag: tuple = (), extra: tuple[str, ...] = (),
                env: dict[str, str] | None = None) -> tuple[Server, Path]:
    """`diag launch DIAG -- vllm serve`, started from `work` (so that `python -m
    diagnose.cli` is the installed diag, or PYTHONPATH's), its run dir and log there."""
    work.mkdir(parents=True, exist_ok=True)
    run_dir, port = work / "run", free_port()
    command = [*DIAG, "launch", "--run-dir", str(run_dir), *diag, "--",
               *serve_command(checkpoint, port, tp, pp, extra)]
    server = Server.start(command, port, cache, tp * pp, work / "diag.log", cwd=work, env=env)
    return server, run_dir


def serve_command(checkpoint: Path, port: int, tp: int, pp: int,
                  extra: tuple[str, ...] = ()) -> list[str]:
    return [str(VLLM), "serve", str(checkpoint), "--served-model-name", "tiny", "--host",
            "127.0.0.1", "--port", str(port), "-tp", str(tp), "-pp", str(pp),
            "--max-model-len", "512", "--max-num-seqs", "8", *extra]


STARTED: list[Server] = []     # every server started; conftest ends those a test left running


@dataclass
class Server:
    """A vLLM server, started as `command` (vllm serve, or diag launch around it),
    with a TMPDIR of its own: short, since vLLM puts unix sockets there. Plain vLLM
    0.32 stopped with SIGINT leaves its TP workers' vllm_dist_*cpushm* segments in
    /dev/shm: with tidy_shm, finish() removes what the server's processes held and
    nobody holds now, as diag launch does for the jobs it runs. A server under diag
    launch gets no such help: that diag cleans up is what the tests check."""
    process: subprocess.Popen
    port: int
    log: Path
    tmp: str
    errors: list[str] = field(default_factory=list)
    tidy_shm: bool = False
    shm: SharedMemoryTracker = field(default_factory=SharedMemoryTracker)

    @classmethod
    def start(cls, command: list[str], port: int, cache: Path, world_size: int,
              log: Path, cwd: Path = REPO, tidy_shm: bool = False,
              env: dict[str, str] | None = None) -> Server:
        """`env`: more variables for the command (HS_TEST_FAULT, say)."""
        tmp = tempfile.mkdtemp(prefix="vllm-")
        sink = open(log, "wb")
        process = subprocess.Popen(command, env={**vllm_env(cache, tmp, world_size), **(env or {})},
                                   stdout=sink,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd)
        server = cls(process, port, log, tmp, tidy_shm=tidy_shm)
        STARTED.append(server)
        return server

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> float:
        """Seconds until /health answers; AssertionError if the command ends first."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            assert self.process.poll() is None, f"ended before ready:\n{self.tail()}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2):
                    self._note_shared_memory()
                    return time.monotonic() - start
            except (urllib.error.URLError, OSError):
                time.sleep(1.0)
        tail = self.tail()
        self.give_up()
        raise AssertionError(f"not ready in {timeout:.0f} s:\n{tail}")

    def give_up(self, grace: float = 30) -> None:
        """Ends the command and all it started: SIGINT (diag launch then ends its job and
        tidies up), SIGKILL to what is left after `grace` (vLLM starting up ignores SIGINT).
        What had to be killed tidied nothing: the /dev/shm files the tree held and nobody
        holds then are removed (a failed test's vLLM left 1.2 GB there)."""
        try:
            tree = [psutil.Process(self.process.pid)]
            tree += tree[0].children(recursive=True)
        except psutil.Error:
            tree = []
        held = SharedMemoryTracker()
        held.sample([process.pid for process in tree])
        self.interrupt()
        _, alive = psutil.wait_procs(tree, timeout=grace)
        for process in alive:
            try:
                process.kill()
            except psutil.Error:
                pass
        try:
            self.finish()
        finally:
            if alive:
                psutil.wait_procs(alive, timeout=grace)
                held.remove_leftovers()

    def complete(self, prompt: str = PROMPT, max_tokens: int = 12, timeout: float = 120) -> str:
        body = json.dumps({"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
                           "temperature": 0, "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/v1/completions",
                                         data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return json.load(response)["choices"][0]["text"]

    def keep_busy(self, stop: threading.Event, texts: list[str]) -> threading.Thread:
        """One request after another (the same batch shape each time) until `stop`."""
        def loop():
            while not stop.is_set():
                try:
                    texts.append(self.complete())
                except (urllib.error.URLError, OSError, ValueError, KeyError) as error:
                    self.errors.append(str(error))
                    time.sleep(0.5)
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        return thread

    def interrupt(self, pid: int | None = None) -> None:
        self._note_shared_memory()
        os.kill(pid or self.process.pid, signal.SIGINT)

    def _note_shared_memory(self) -> None:
        if not self.tidy_shm:
            return
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            return
        self.shm.sample([self.process.pid, *(child.pid for child in tree)])

    def finish(self, timeout: float = 180) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"did not end in {timeout:.0f} s:\n{self.tail()}") from None
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)
            if self.tidy_shm:
                self.shm.remove_leftovers()

    def bench(self, checkpoint: Path, result: Path, args) -> dict:
        """vLLM's own client against this server (`vllm bench serve`, random prompts of
        fixed lengths, --ignore-eos); its result JSON."""
        subprocess.run([str(VLLM), "bench", "serve", "--backend", "openai", "--base-url",
                        f"http://127.0.0.1:{self.port}", "--model", "tiny", "--tokenizer",
                        str(checkpoint), "--dataset-name", "random", "--random-input-len",
                        str(args.input_len), "--random-output-len", str(args.output_len),
                        "--num-prompts", str(args.num_prompts), "--max-concurrency",
                        str(args.concurrency), "--ignore-eos", "--save-result",
                        "--result-dir", str(result.parent), "--result-filename", result.name],
                       check=True, capture_output=True, timeout=1800)
        return json.loads(result.read_text())

    def bench_then_stop(self, checkpoint: Path, result: Path, args) -> dict:
        """Once ready, bench() once; then stop the server with SIGINT, whatever happened."""
        try:
            self.wait_ready()
            return self.bench(checkpoint, result, args)
        finally:
            self.interrupt()
            self.finish()

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
