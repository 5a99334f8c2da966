"""Every command in the README's code blocks, as written, on the repo's own
samples: each is run, its placeholders (RUN_DIR, FR_DUMPS, CMD, ...) filled
from tests/fixtures and tests/programs, unless it needs what a test here cannot
have (a long-running server, another node, a terminal for minutes, a fixed
port); those are parsed by the command's own parser, and PARSED_ONLY says why.
A command the README gains is parsed at least, and the test names it."""
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pexpect
import pytest

from diagnose.cli import build_parser
from engine.entrypoints.cli import parse as parse_engine
from helpers.run import free_port, left_behind
from helpers.terminal import Terminal

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(REPO, "tests", "fixtures")
PROGRAMS = os.path.join(REPO, "tests", "programs")
RECORDED_RUN = os.path.join(FIXTURES, "runs", "rank6_never_reached")
LOGS = os.path.join(FIXTURES, "logs")

# The placeholders, as the samples fill them.
PLACEHOLDERS = {
    "FR_DUMPS": os.path.join(FIXTURES, "fr_hang"),
    "MODEL": "smollm2-135m",
    "CMD ...": "python -c pass",
    "CMD": "python -c pass",
    "train.py": os.path.join(PROGRAMS, "dp_train.py"),
    "mymodule:MyClass.step": "plain_steps:Server.step",
    "my_server.py": os.path.join(PROGRAMS, "plain_server.py"),
    "serve.log": os.path.join(LOGS, "vllm_tp2pp2_worker_assert.log"),
    "rank*.log": os.path.join(LOGS, "torchrun_gloo_skip.log"),
    "/tmp/big": "BIG_DIR",
}

# Commands that are parsed, not run, and why.
PARSED_ONLY = {
    "./setup.sh": "installs the environment these tests run in (setup.sh is checked by bash -n)",
    ".venv/bin/pytest": "the test suite itself",
    ".venv/bin/diag demo": "60 s or more of tp=2 pp=4; its job and TUI are tests/test_tui_e2e.py's",
    "serve": "a server runs until it is stopped (tests/test_server.py serves)",
    "--tui": "a TUI over a 30 s engine job (tests/test_tui_e2e.py runs this one)",
    "--metrics-port": "binds a fixed port",
    "vllm serve": "a real vLLM server (tests/test_vllm.py starts them)",
    "--nnodes": "a second node",
    "--beat": "--beat beats until Ctrl-C",
    "bench": "a throughput sweep of minutes (tests/test_bench.py runs small ones)",
    "export": "sets the environment of the next lines",
    "diag attach": "needs a job that hangs now, started without diag (tests/test_attach.py)",
}
SHELL_PID = re.compile(r"\$\([^)]*\)")      # $(pgrep ...): the pid of a running process


def readme_commands() -> list[str]:
    """The lines of the README's bash blocks, continuations joined, comments cut."""
    with open(os.path.join(REPO, "README.md")) as readme:
        blocks = re.findall(r"```bash\n(.*?)```", readme.read(), re.S)
    commands = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                commands.append(line)
    return commands


def variants(command: str) -> list[str]:
    """`[--native]`, `[--json] [--perfetto trace.json]`: without its options, then with
    all of them."""
    optional = re.findall(r"\s\[([^\]]+)\]", command)
    bare = re.sub(r"\s\[[^\]]+\]", "", command)
    return [bare, " ".join([bare, *optional])] if optional else [command]


def argv_of(command: str, run_dir: str, big_dir: str) -> list[str]:
    command = SHELL_PID.sub("PID", command).replace("PID", str(os.getpid()))
    for placeholder, sample in PLACEHOLDERS.items():
        command = command.replace(placeholder, sample)
    words = shlex.split(command.replace("RUN_DIR", run_dir).replace("BIG_DIR", big_dir))
    out = []
    for word in words:
        if word in ("diag", ".venv/bin/diag"):
            out += [sys.executable, "-m", "diagnose.cli"]
        elif word in ("python", ".venv/bin/python"):
            out.append(sys.executable)
        elif word == "torchrun":
            out += [sys.executable, "-m", "torch.distributed.run"]
        else:
            out.append(word)
    return out


def why_parsed_only(command: str) -> str | None:
    for key, why in PARSED_ONLY.items():
        if command.startswith(key) or f" {key} " in f" {command} ":
            return why
    return None


def parse_only(command: str) -> None:
    """The command's own parser accepts it (argparse exits 2 on what it does not)."""
    command = re.sub(r"^([A-Z_]+=\S+\s+)+", "", command)    # VAR=value before the program
    if command.startswith("./setup.sh"):
        assert subprocess.run(["bash", "-n", os.path.join(REPO, "setup.sh")]).returncode == 0
        return
    if command.startswith(("export", ".venv/bin/pytest")):
        return
    argv = argv_of(command, "RUN", "BIG")[1:]
    if argv[:2] == ["-m", "diagnose.cli"]:
        args = build_parser().parse_args(argv[2:])
        tail = getattr(args, "cmd", None) or []
        argv = [word for word in tail if word not in ("--", sys.executable)]
        if argv[:2] != ["-m", "engine"]:
            return            # python -c, vllm serve, torchrun: their parsers are not ours
    assert argv[:2] == ["-m", "engine"], command
    parse_engine(argv[2:])


def run(argv: list[str], timeout: float = 180, **kwargs) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, PROGRAMS]), PLAIN_STEPS="20")
    return subprocess.run(argv, cwd=kwargs.pop("cwd", REPO), env=env, capture_output=True,
                          text=True, timeout=timeout, **kwargs)


@pytest.fixture
def live_run(tmp_path):
    """A live run dir: diag launch around a plain program whose step blocks."""
    run_dir = tmp_path / "live"
    argv = [sys.executable, "-m", "diagnose.cli", "launch", "--run-dir", str(run_dir),
            "--on-hang", "wait", "--mark", "plain_steps:Server.step", "--", sys.executable,
            os.path.join(PROGRAMS, "plain_server.py")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, PROGRAMS]), PLAIN_STALL_AT="0")
    launcher = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (run_dir / "rank-0.probe").exists() and time.monotonic() < deadline:
            assert launcher.poll() is None
            time.sleep(0.1)
        yield str(run_dir)
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=60)
    assert not left_behind(run_dir)


def test_every_readme_command_is_covered():
    commands = readme_commands()
    assert len(commands) > 15
    for command in commands:
        for variant in variants(command):
            try:
                parse_only(variant)
            except (Exception, SystemExit) as error:
                pytest.fail(f"README: {variant!r} does not parse ({error!r}); a new placeholder "
                            f"goes in PLACEHOLDERS, a command a test cannot run in PARSED_ONLY")


def test_the_readme_commands_run_on_the_samples(tmp_path, live_run):
    """Each README command that a test can run, run as written (its exit code as the
    README's table says); the rest are parsed above."""
    ran = []
    finished = str(tmp_path / "finished")
    shutil.copytree(RECORDED_RUN, finished)
    for command in readme_commands():
        if why_parsed_only(command) is not None:
            continue
        for variant in variants(command):
            run_dir = live_run if variant.startswith("diag dump") else finished
            if variant.startswith("diag tui"):
                check_tui(argv_of(variant, run_dir, ""), tmp_path)
            else:
                check(variant, argv_of(variant, run_dir, ""), tmp_path)
            ran.append(variant)
    assert {"diag dump RUN_DIR", "diag dump RUN_DIR --native", "diag tui RUN_DIR"} <= set(ran)
    assert any(command.startswith("diag analyze FR_DUMPS") for command in ran)


EXPECTED = {            # exit codes: 0 healthy or dumped, 1 verdicts or findings
    "diag launch --on-hang kill": 0,
    "diag dump": 0,
    "diag analyze RUN_DIR": 1,
    "diag analyze FR_DUMPS": 1,
    "diag launch -- torchrun": 0,
    "diag launch --mark": 0,
    "diag logs": 1,
    ".venv/bin/python -m engine generate": 0,
}


def check(command: str, argv: list[str], tmp_path) -> None:
    if "torch.distributed.run" in argv:
        at = argv.index("torch.distributed.run") + 1
        argv[at:at] = ["--master-port", str(free_port()), "--monitor-interval", "0.5"]
    if argv[2:4] == ["diagnose.cli", "launch"]:
        argv[4:4] = ["--run-dir", str(tmp_path / f"launch-{len(os.listdir(tmp_path))}")]
    done = run(argv, cwd=tmp_path)
    expected = next((code for start, code in EXPECTED.items() if command.startswith(start)), None)
    assert expected is not None, f"no exit code known for {command!r}"
    assert done.returncode == expected, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    if command.startswith("diag dump"):
        assert "rank 0 (probe)" in done.stdout and "rank 0 (py-spy" in done.stdout, done.stdout
    if command.startswith("diag analyze FR_DUMPS"):
        assert "rank 3 never joined tp1 all_reduce" in done.stdout.replace("\n", " ")
    if "engine generate" in command and "--json" not in command:
        assert "-> token ids [" in done.stdout and "random weights" in done.stderr


def check_tui(argv: list[str], tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "TERM": "xterm-256color", "HOME": str(tmp_path),
           "PYTHONPATH": REPO}
    terminal = Terminal(argv, env, columns=80, lines=24)
    try:
        terminal.wait_for(r"rank 6 · stage 3 · tp 0 ·\s+CULPRIT", 60)   # 80x24: the detail's
        terminal.wait_for(r"block_forever", 5)
        terminal.child.send("q")
        terminal.child.expect(pexpect.EOF, timeout=30)
    finally:
        terminal.child.close(force=True)
    assert terminal.child.exitstatus == 0
