"""Bad input to diag launch, dump and demo: one line on stderr, exit 2, never a
traceback, and nothing started; diag's own failures: one line, exit 3; and the
command line itself: its version, its list of commands, help on every argument."""
import argparse
from importlib import metadata

import pytest

from diagnose import cli
from diagnose.cli import analyze as cli_analyze
from helpers.run import diag


@pytest.mark.parametrize("argv,says", [
    (["launch"], "needs a command after --"),
    (["launch", "--"], "needs a command after --"),
    (["launch", "--fault", "rank=1,at=nowhere,kind=hang", "--", "true"], "unknown phase"),
    (["launch", "--fault", "rank=1,at=forward,kind=explode", "--", "true"], "unknown kind"),
    (["launch", "--launch-blocking", "one", "--", "true"], "ranks like 0,3"),
    (["launch", "--stall-timeout", "-3", "--", "true"], "seconds >= 0"),
    (["launch", "--stall-timeout", "0", "--", "true"], "at least 0.5 s for diag launch"),
    (["launch", "--stall-timeout", "0.2", "--", "true"], "at least 0.5 s for diag launch"),
    (["launch", "--cpu-stretch", "0.5", "--", "true"], "a number >= 1 (1: no stretch)"),
    (["launch", "--cpu-stretch", "inf", "--", "true"], "a number >= 1 (1: no stretch)"),
    (["launch", "--fault", "rank=0,at=forward,kind=sleep:inf", "--", "true"], "finite number"),
    (["launch", "--fault", "rank=0,at=forward,kind=sleep:nan", "--", "true"], "finite number"),
    (["launch", "--run-dir", "/proc/diag-run", "--", "true"], "cannot use run dir /proc/diag-run"),
    (["launch", "--run-dir", "/sys/kernel", "--", "true"], "cannot use run dir /sys/kernel: "),
    (["launch", "--run-dir", "RUN/not-a-dir/run", "--", "true"], "Not a directory"),
    (["launch", "--run-dir", "RUN/run", "--", "RUN/not-executable"], "Permission denied"),
    (["launch", "--on-hang", "panic", "--", "true"], "unknown action 'panic'"),
        (["launch", "--on-hang", "kill:soon", "--", "true"], "kill:SECONDS needs seconds"),
        (["launch", "--on-hang", "wait,kill", "--", "true"], "wait only watches"),
        (["launch", "--on-hang", "exec:", "--", "true"], "exec: needs a command"),
        (["launch", "--metrics-port", "http", "--", "true"], "port number 0-65535"),
    (["launch", "--run-dir", "RUN/run", "--", "/no/such/program"], "cannot run"),  # not runs/ in the checkout
    (["dump", "/no/such/run"], "no such file or directory"),
    (["tui", "/no/such/run"], "/no/such/run"),
    (["demo", "--bogus"], "unrecognized arguments"),
    (["demo", "--no-tui", "--run-dir", "/proc/diag-demo"], "cannot use run dir /proc/diag-demo"),
    (["frobnicate"], "invalid choice"),
])
def test_bad_input_is_one_line(tmp_path, argv, says):
    (tmp_path / "not-a-dir").write_text("")
    (tmp_path / "not-executable").write_text("#!/bin/sh\necho hi\n")
    done = diag(*[a.replace("RUN", str(tmp_path)) for a in argv])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], done.stderr
    assert "Traceback" not in done.stderr


def _fails(args):
    raise KeyError("a bug")


def test_a_failure_of_diag_itself_is_one_line_and_exit_3(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(cli_analyze, "analyze_command", _fails)
    monkeypatch.delenv(cli.DEBUG_VAR, raising=False)
    assert cli.main(["analyze", str(tmp_path)]) == cli.EXIT_INTERNAL == 3
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("diag: internal error: KeyError: 'a bug'")
    monkeypatch.setenv(cli.DEBUG_VAR, "1")
    assert cli.main(["analyze", str(tmp_path)]) == 3
    assert "Traceback" in capsys.readouterr().err


def test_ctrl_c_outside_a_run_is_one_line_and_exit_130(monkeypatch, capsys, tmp_path):
    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli_analyze, "analyze_command", interrupted)
    assert cli.main(["analyze", str(tmp_path)]) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["diag: interrupted"]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    [commands] = [action for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction)]
    return dict(commands.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_helps_on_every_argument_and_ends_with_codes_and_examples(
        name, capsys):
    parser = subcommands()[name]
    unexplained = [action.dest for action in parser._actions
                   if not action.help and action.help != argparse.SUPPRESS]
    assert unexplained == []
    with pytest.raises(SystemExit) as done:
        cli.main([name, "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    codes, examples = text.index("\nexit codes:\n"), text.index("\nexamples:\n")
    assert codes < examples
    assert "  2    bad input" in text[codes:examples]
    assert f"  diag {name}" in text[examples:]


def test_diag_alone_lists_every_command_on_stdout_and_exits_0():
    done = diag()
    assert done.returncode == 0 and done.stderr == ""
    listed = {line.split()[0]: line for line in done.stdout.splitlines() if line.startswith("    ")}
    assert set(subcommands()) <= set(listed)
    assert "name the culprit" in listed["analyze"]


def test_version_is_the_installed_distributions(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out == f"diag (hangscope) {metadata.version('hangscope')}\n"


def test_version_in_a_checkout_never_installed_is_pyprojects(monkeypatch):
    from diagnose.cli import version

    def missing(name):
        raise metadata.PackageNotFoundError(name)
    monkeypatch.setattr(version.metadata, "version", missing)
    with open(f"{version.CHECKOUT}/pyproject.toml") as source:
        declared = version.VERSION_LINE.search(source.read())[1]
    assert version.package_version() == f"{declared} (source checkout at {version.CHECKOUT})"
    monkeypatch.setattr(version, "CHECKOUT", "/nonexistent")
    assert version.package_version().startswith("unknown")


def test_launch_output_keeps_its_old_name_hidden():
    parser = cli.build_parser()
    for flag in ("-o", "--output", "--json-report"):
        assert parser.parse_args(["launch", flag, "r.json", "--", "true"]).output == "r.json"
    assert "--json-report" not in subcommands()["launch"].format_help()
