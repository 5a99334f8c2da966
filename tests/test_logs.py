"""diag logs on the sample logs in tests/fixtures/logs/."""
import json
import os

from diagnose import cli
from diagnose.offline.logs import scan_file

LOGS = os.path.join(os.path.dirname(__file__), "fixtures", "logs")


def findings(name):
    return [(finding.line, finding.kind, finding.explanation)
            for finding in scan_file(os.path.join(LOGS, name))]


def test_watchdog_names_rank_op_and_seq():
    (line, kind, text), (_, _, second) = findings("torch_watchdog.log")
    assert (line, kind) == (3, "watchdog_timeout")
    assert text.startswith("rank 1: collective watchdog timeout in ALLREDUCE SeqNum=12 after 600 s")
    assert second.startswith("rank 3: collective watchdog timeout in _ALLGATHER_BASE SeqNum=7")


def test_vllm_log():
    found = findings("vllm_serve.log")
    assert [(line, kind) for line, kind, _ in found] == [
        (3, "shm_broadcast_stalled"), (4, "cuda_error"), (5, "out_of_memory"),
        (6, "lmcache_negative_load")]          # line 7, a positive load, is left alone
    assert "stopped taking the driver's broadcast" in found[0][2]
    assert "diag launch --launch-blocking 2" in found[1][2]
    assert "benign" in found[3][2] and "-128" in found[3][2]


def test_engine_log():
    found = findings("engine.log")
    assert [(line, kind) for line, kind, _ in found] == [
        (3, "cuda_error"), (4, "rank_died"), (5, "rank_died")]
    assert "device-side assert triggered" in found[0][2]
    assert found[1][2].startswith("rank 3 (pp 1/2, tp 1) was killed by signal SIGKILL")
    assert "dmesg" in found[1][2]
    assert found[2][2].startswith("rank 1 (pp 0/2, tp 1) exited with code 1")


def test_huge_file_streams(tmp_path):
    path = tmp_path / "big.log"
    with open(path, "w") as sink:
        for _ in range(200):
            sink.write("step ok loss 1.0\n" * 1000)
        sink.write("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1 GiB\n")
    assert [(f.line, f.kind) for f in scan_file(str(path))] == [(200_001, "out_of_memory")]


def test_cli_json(capsys):
    assert cli.main(["logs", "--json", os.path.join(LOGS, "engine.log")]) == cli.EXIT_VERDICTS
    body = json.loads(capsys.readouterr().out)
    assert [finding["kind"] for finding in body] == ["cuda_error", "rank_died", "rank_died"]


def test_cli_binary_and_missing_files(capsys, tmp_path):
    binary = os.path.join(LOGS, "not_a_log.zip")
    assert cli.main(["logs", binary, str(tmp_path / "absent.log")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == [f"diag: {binary}: binary file, not a log",
                   f"diag: {tmp_path / 'absent.log'}: no such file or directory",
                   "diag: error: no log file could be read"]
    # one readable file is enough to go on, and the others are still named
    assert cli.main(["logs", binary, os.path.join(LOGS, "engine.log")]) == cli.EXIT_VERDICTS
    out, err = capsys.readouterr()
    assert "binary file" in err and "rank_died" in out


def test_cli_directory_and_clean_log(capsys, tmp_path):
    clean = tmp_path / "clean.log"
    clean.write_text("all good\n")
    assert cli.main(["logs", str(tmp_path), str(clean)]) == cli.EXIT_HEALTHY
    out, err = capsys.readouterr()
    assert "is a directory" in err and "no known failure pattern" in out
