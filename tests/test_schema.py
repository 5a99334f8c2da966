"""Every JSON diag writes carries its schema_version (docs/json.md); diag reads its
own files at that version or older, and refuses a newer one with one line."""
import json
import os
import shutil

import pytest

from diagnose import cli
from diagnose.core import schema

FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures")
NO_FAULT = os.path.join(FIXTURES, "runs", "no_fault")


def run(capsys, *argv):
    code = cli.main([*map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_version_is_read_up_to_the_current_one_and_refused_past_it():
    body = {"command_exit": 0}
    assert schema.read_version(schema.Document.EXIT, body) == body          # before the field
    stamped = schema.stamped(schema.Document.EXIT, body)
    assert list(stamped) == ["schema_version", "command_exit"]
    assert schema.read_version(schema.Document.EXIT, stamped) == body
    with pytest.raises(schema.NewerSchema, match="schema_version 3 is newer than this diag "
                                                 r"reads \(2\): upgrade hangscope"):
        schema.read_version(schema.Document.EXIT, body | {"schema_version": 3})
    for bad in ("2", True, 0, 1.5):
        with pytest.raises(ValueError, match="is no version"):
            schema.read_version(schema.Document.EXIT, body | {"schema_version": bad})


@pytest.mark.parametrize("name, body, current", [
    ("exit.json", {"command_exit": 0, "stopped_by": None, "stop": None}, 2),
    ("node-1.json", {"node_rank": 1, "ranks": {}}, 2),
])
def test_a_run_dir_file_from_a_newer_diag_is_refused_with_one_line(tmp_path, capsys, name, body,
                                                                    current):
    shutil.copytree(NO_FAULT, tmp_path / "run")
    (tmp_path / "run" / name).write_text(json.dumps(body | {"schema_version": 7}))
    code, out, err = run(capsys, "analyze", tmp_path / "run")
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("diag: error: ")
    assert f"{name}: schema_version 7 is newer than this diag reads ({current})" in err


def test_what_analyze_and_logs_print_and_write_carry_their_version(tmp_path, capsys):
    trace = tmp_path / "trace.json"
    code, out, _ = run(capsys, "analyze", NO_FAULT, "--json", "--perfetto", trace)
    assert code == 0 and json.loads(out)["schema_version"] == 1
    assert json.loads(trace.read_text())["schema_version"] == 1
    log = os.path.join(FIXTURES, "logs", "vllm_tp2_hang.log")
    code, out, _ = run(capsys, "logs", log, "--json", "-o", tmp_path / "logs.json")
    assert json.loads(out) == json.loads((tmp_path / "logs.json").read_text())
    assert json.loads(out)["schema_version"] == 1
