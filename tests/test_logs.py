"""diag logs on real logs (tests/fixtures/logs/README.md says where each came from)."""
import json
import os

import pytest

from diagnose import cli
from diagnose.offline.logs import Kind, Severity, scan_file, scan_files
from diagnose.offline.logs import reader
from diagnose.offline.logs.reader import MAX_LINE, raw_lines

LOGS = os.path.join(os.path.dirname(__file__), "fixtures", "logs")


def read(name):
    findings = scan_file(os.path.join(LOGS, name))
    said = [(finding.kind, finding.summary) for finding in findings]
    said += [(link.kind, link.summary) for finding in findings for link in finding.chain]
    assert len(said) == len(set(said)), f"a finding is repeated: {said}"
    return findings


def lines(name):
    with open(os.path.join(LOGS, name), "rb") as source:
        return source.read().splitlines(keepends=True)


def write(path, chosen):
    with open(path, "wb") as sink:
        sink.writelines(chosen)
    return str(path)


def test_vllm_worker_exception_first_then_its_chain():
    first, = read("vllm_tp2pp2_worker_assert.log")
    assert (first.kind, first.severity, first.rank) == (Kind.EXCEPTION, Severity.FAILURE, 2)
    assert first.process == "Worker_PP1_TP0 (rank 2, PP stage 1, TP 0)"
    assert first.summary.startswith(
        "Worker_PP1_TP0 (rank 2, PP stage 1, TP 0): AssertionError at "
        "labprobe/__init__.py:224 execute_model: `assert False, (f\"labprobe: injected fault")
    assert first.summary.endswith("injected fault in execute_model (rank 2, step 2)")
    assert (first.first, first.line) == ("12-01 05:29:58", 48)
    assert [link.kind for link in first.chain] == [Kind.ENGINE_CORE_FATAL, Kind.ENGINE_DEAD,
                                                   Kind.HTTP_ERROR]
    assert first.chain[0].summary.startswith("EngineCore: fatal error: RuntimeError: Worker failed")
    assert first.chain[2].summary == "HTTP 500 for POST /v1/completions"


def test_tracebacks_of_processes_that_interleave_come_apart(tmp_path):
    """The worker's and the engine core's tracebacks, line by line in turn."""
    every = lines("vllm_tp2pp2_worker_assert.log")
    worker = [line for line in every if line.startswith(b"(Worker_PP1_TP0") and b"ERROR" in line]
    core = [line for line in every if line.startswith(b"(EngineCore") and b"[core.py:1512]" in line]
    mixed = [line for pair in zip(worker, core) for line in pair]
    mixed += worker[len(core):] + core[len(worker):]
    rest = [line for line in every if line not in worker and line not in core]
    first, = scan_file(write(tmp_path / "mixed.log", rest[:10] + mixed + rest[10:]))
    assert first.process == "Worker_PP1_TP0 (rank 2, PP stage 1, TP 0)"
    assert "AssertionError at labprobe/__init__.py:224" in first.summary
    assert [link.kind for link in first.chain][:2] == [Kind.ENGINE_CORE_FATAL, Kind.ENGINE_DEAD]


def test_rank_from_the_worker_name_says_when_tp_size_is_assumed(tmp_path):
    kept = [line for line in lines("vllm_tp2pp2_worker_assert.log")
            if b"parallel_state.py" not in line and b"tensor_parallel_size" not in line]
    first, = scan_file(write(tmp_path / "bare.log", kept))
    assert first.process == ("Worker_PP1_TP0 (rank 2, PP stage 1, TP 0; tp_size 2 assumed: "
                             "the log does not state it)")


def test_vllm_hang_is_one_finding_with_the_timeout_in_its_chain():
    hang, = read("vllm_tp2_hang.log")
    assert (hang.kind, hang.severity) == (Kind.EXECUTE_MODEL_HANG, Severity.HANG)
    assert (hang.count, hang.first, hang.last) == (1, "12-01 05:32:17", "12-01 05:32:17")
    assert "no free shared-memory broadcast block for 60 s" in hang.summary
    assert "the RPC call to execute_model timed out at 12-01 05:32:56" in hang.summary
    assert [link.kind for link in hang.chain] == [Kind.RPC_TIMEOUT, Kind.ENGINE_DEAD,
                                                  Kind.HTTP_ERROR]
    assert "vLLM's log does not say which worker" in hang.advice
    assert "compilation" in hang.advice and "here none did" in hang.advice
    assert hang.advice.endswith(
        "diag launch --on-hang kill -- vllm serve /work/vllm-lab/tiny-llama --host 127.0.0.1 "
        "--port 18009 --served-model-name tiny --tensor-parallel-size 2")


def test_a_warning_printed_again_is_counted_not_repeated(tmp_path):
    every = lines("vllm_tp2_hang.log")
    warning = next(line for line in every if b"shared memory broadcast block" in line)
    at = every.index(warning)
    hang, = scan_file(write(tmp_path / "again.log", every[:at] + [warning] * 3 + every[at + 1:]))
    assert (hang.kind, hang.count) == (Kind.EXECUTE_MODEL_HANG, 3)
    assert "3 times, first 12-01 05:32:17, last 12-01 05:32:17" in hang.summary


def test_healthy_vllm_logs_have_no_failure(capsys):
    assert read("vllm_tp2_healthy.log") == []
    notes = read("vllm_tp1_slow_compile.log")
    assert [(note.kind, note.severity) for note in notes] == [
        (Kind.SLOW_BROADCAST, Severity.NOTE), (Kind.AFTER_SHUTDOWN, Severity.NOTE)]
    assert "during start-up, and requests finished after it" in notes[0].summary
    assert "EngineDeadError" in notes[1].summary
    assert cli.main(["logs", os.path.join(LOGS, "vllm_tp1_slow_compile.log")]) == cli.EXIT_HEALTHY
    assert "no failure found" in capsys.readouterr().out


def test_vllm_worker_killed_names_its_rank():
    first, = read("vllm_tp2_worker_sigkill.log")
    assert (first.kind, first.rank) == (Kind.WORKER_DIED, 1)
    assert first.summary == ("VllmWorker-1, that is Worker_TP1 (rank 1, TP 1), died unexpectedly "
                             "(exit code -9: SIGKILL)")
    assert [link.kind for link in first.chain] == [Kind.PEER_LOST, Kind.ENGINE_CORE_FATAL,
                                                   Kind.ENGINE_DEAD, Kind.HTTP_ERROR]
    assert first.chain[0].summary.startswith("Worker_TP0 (rank 0, TP 0): RuntimeError")


@pytest.mark.parametrize("name", ["torchrun_gloo_skip_tee.log", "torchrun_gloo_skip.log"])
def test_torchrun_gloo_names_the_rank_that_skipped(name):
    first, = read(name)
    assert (first.kind, first.rank) == (Kind.COLLECTIVE_BEHIND, 2)
    assert first.summary.startswith("rank 2 did not join the all_reduce that ranks 0-1 and 3 "
                                    "timed out in (gloo after 20 s)")
    waited = [link for link in first.chain if link.kind == Kind.COLLECTIVE_TIMEOUT]
    assert [link.rank for link in waited] == [0, 1, 3]
    assert waited[0].summary == ("rank 0 waited: timed out in all_reduce after 20 s, "
                                 "at gloo_skip.py:42 main")
    assert Kind.JOB_STOPPED in {link.kind for link in first.chain}
    assert "calls rank 0 the \"Root Cause\"" in first.advice


def test_torchrun_tee_shows_what_the_silent_rank_said_last():
    first, = read("torchrun_gloo_skip_tee.log")
    assert "Rank 2's last line: \"rank 2 finished 20 steps\"" in first.advice


def test_nccl_watchdog_ranks_compared_per_process_group():
    first, = read("nccl_watchdog_vllm23448.log")
    assert (first.kind, first.rank) == (Kind.COLLECTIVE_BEHIND, 3)
    assert first.summary.startswith("rank 3 is behind in PG 4 (GUID 67): its last completed "
                                    "collective is #5728, rank 0 completed #5729")
    assert [link.summary for link in first.chain] == [
        "rank 0 waited: timed out in BROADCAST #5730, after 600 s, last completed #5729, "
        "last enqueued #6464"]


def test_nccl_ranks_logged_to_separate_files(tmp_path):
    every = lines("nccl_watchdog_vllm23448.log")
    paths = [write(tmp_path / "rank0.log", every[:4]), write(tmp_path / "rank3.log", every[4:])]
    first, = scan_files(paths).findings
    assert (first.kind, first.rank, os.path.basename(first.path)) == (
        Kind.COLLECTIVE_BEHIND, 3, "rank3.log")


def test_nccl_desync_report_names_the_lagging_rank():
    first, = read("nccl_desync_pytorch152623.log")
    assert (first.kind, first.rank) == (Kind.COLLECTIVE_BEHIND, 7)
    assert first.summary.startswith("rank 7 finished collective #182 but never joined #183")
    assert "of rank 0, which timed out in ALLREDUCE #315" in first.summary
    assert first.chain[0].summary.startswith("rank 0 waited: timed out in ALLREDUCE #241")


def test_nccl_desync_report_where_every_rank_joined():
    first, = read("nccl_desync_all_joined_llamafactory9496.log")
    assert (first.kind, first.rank) == (Kind.COLLECTIVE_STUCK, None)
    assert first.summary.startswith("ranks 0-15 all joined collective #730 and none finished it")
    assert "network" in first.advice


def test_engine_rank_killed_and_the_ranks_that_lost_it():
    first, = read("engine_tp2pp2_rank3_sigkill.log")
    assert (first.kind, first.rank) == (Kind.RANK_DIED, 3)
    assert first.summary == "rank 3 (pp 1/2, tp 1) was killed by signal SIGKILL"
    assert "dmesg" in first.advice
    assert [(link.kind, link.rank) for link in first.chain] == [(Kind.PEER_LOST, 1),
                                                               (Kind.PEER_LOST, 2)]
    assert first.chain[0].summary == ("rank 1: RuntimeError at communicator.py:96 send: "
                                      "Connection reset by peer")


def test_cuda_error_oom_and_lmcache():
    cuda, = read("nccl_cuda_error_vllm28028.log")
    assert (cuda.kind, cuda.rank) == (Kind.CUDA_ERROR, 1)
    assert cuda.summary == "rank 1: CUDA error: an illegal memory access was encountered"
    assert "diag launch --launch-blocking 1" in cuda.advice
    oom, = read("vllm_worker_oom_vllm15039.log")
    assert oom.kind == Kind.OUT_OF_MEMORY and oom.summary.endswith("of which 16.00 MiB is free.")
    assert "gpu_memory_utilization" in oom.advice
    lmcache, = read("lmcache_lmcache2703_889.log")     # the second line, a positive load, is fine
    assert (lmcache.kind, lmcache.severity) == (Kind.LMCACHE_NEGATIVE_LOAD, Severity.NOTE)
    assert "-64" in lmcache.summary and "benign" in lmcache.advice


def test_huge_file_streams(tmp_path):
    path = tmp_path / "big.log"
    oom = lines("vllm_worker_oom_vllm15039.log")[0]
    with open(path, "wb") as sink:
        for _ in range(200):
            sink.write(b"step ok loss 1.0\n" * 1000)
        sink.write(oom)
    assert [(f.line, f.kind) for f in scan_file(str(path))] == [(200_001, Kind.OUT_OF_MEMORY)]


def test_an_endless_line_is_cut(tmp_path):
    path = tmp_path / "one.log"
    path.write_bytes(b"x" * (3 << 20) + b"\nlast\n")
    with open(path, "rb") as source:
        assert [len(line) for line in raw_lines(source)] == [MAX_LINE, 4]


def test_cli_json(capsys):
    path = os.path.join(LOGS, "vllm_tp2pp2_worker_assert.log")
    assert cli.main(["logs", "--json", path]) == cli.EXIT_VERDICTS
    body = json.loads(capsys.readouterr().out)
    assert body["schema_version"] == 1 and body["files"] == [path]
    findings = body["findings"]
    assert [(finding["kind"], finding["rank"]) for finding in findings] == [("exception", 2)]
    assert [link["kind"] for link in findings[0]["chain"]] == ["engine_core_fatal", "engine_dead",
                                                              "http_error"]


def test_cli_binary_and_missing_files(capsys, tmp_path):
    binary = os.path.join(LOGS, "not_a_log.zip")
    assert cli.main(["logs", binary, str(tmp_path / "absent.log")]) == cli.EXIT_ERROR
    err = capsys.readouterr().err.splitlines()
    assert err == [f"diag: {binary}: binary file, not a log",
                   f"diag: {tmp_path / 'absent.log'}: no such file or directory",
                   "diag: error: no log file could be read"]
    # the readable file is still read and reported; the exit says an input was bad
    assert cli.main(["logs", binary, os.path.join(LOGS, "vllm_tp2_hang.log")]) == cli.EXIT_ERROR
    out, err = capsys.readouterr()
    assert err == f"diag: {binary}: binary file, not a log\n"
    assert "stopped returning from execute_model" in out


def test_cli_directory_and_clean_log(capsys, tmp_path):
    clean = tmp_path / "clean.log"
    clean.write_text("all good\n")
    assert cli.main(["logs", str(clean)]) == cli.EXIT_HEALTHY
    assert "no failure found" in capsys.readouterr().out
    assert cli.main(["logs", str(tmp_path), str(clean)]) == cli.EXIT_ERROR
    assert capsys.readouterr().err == f"diag: {tmp_path}: is a directory\n"


def test_chunk_boundaries_change_nothing(monkeypatch):
    """Lines, tracebacks and prefixes cut across the reader's chunks read the same."""
    whole = [(f.kind, f.summary, [link.summary for link in f.chain])
             for f in read("vllm_tp2pp2_worker_assert.log") + read("torchrun_gloo_skip_tee.log")]
    monkeypatch.setattr(reader, "CHUNK", 97)
    small = [(f.kind, f.summary, [link.summary for link in f.chain])
             for f in read("vllm_tp2pp2_worker_assert.log") + read("torchrun_gloo_skip_tee.log")]
    assert small == whole


def test_vllm_process_names_in_any_order_and_the_older_forms():
    from diagnose.offline.logs.processes import Job, Processes
    from diagnose.offline.logs.reader import parse

    def describe(raw, job):
        procs = Processes(job)
        return procs.describe(procs.of(0, parse(1, raw)))

    sized = Job(tp_size=2, pp_size=2, sizes_from="the engine's config line")
    assert describe(b"(Worker_TP1_PP1 pid=11) INFO 12-01 05:29:12 [x.py:1] hi", sized) == (
        "Worker_TP1_PP1 (rank 3, PP stage 1, TP 1)", 3)
    # vLLM leaves TP out of the name when tp_size is 1: so the log need not say it
    assert describe(b"(Worker_PP1 pid=12) INFO 12-01 05:29:12 [x.py:1] hi", Job()) == (
        "Worker_PP1 (rank 1, PP stage 1)", 1)
    assert describe(b"(VllmWorker rank=2 pid=13) ERROR 06-26 23:10:17 [x.py:5] hi", Job()) == (
        "VllmWorker (rank 2)", 2)
    assert describe(b"[default3]:[rank3]: RuntimeError: boom", Job()) == ("rank 3", 3)


def test_piped_findings_keep_one_line_each(capsys, monkeypatch):
    """Not a terminal (capsys, as a CI log): a finding's headline is one line,
    however narrow COLUMNS says the screen is."""
    monkeypatch.setenv("COLUMNS", "60")
    path = os.path.join(LOGS, "vllm_tp2pp2_worker_assert.log")
    assert cli.main(["logs", path]) == cli.EXIT_VERDICTS
    out = capsys.readouterr().out.splitlines()
    [finding] = read("vllm_tp2pp2_worker_assert.log")[:1]
    assert f"FIRST  {finding.summary}" in out
    assert max(map(len, out)) > 60


def test_an_exception_before_diags_verdict_stays_first(tmp_path):
    """diag's 'dead' verdict comes after the rank's own traceback: the traceback is
    the first failure (it says why), diag's line another finding; what follows
    diag's stop is a note."""
    log = write(tmp_path / "capture.log", [
        b"[rank1]: Traceback (most recent call last):\n",
        b'[rank1]:   File "/job/train.py", line 9, in step\n',
        b"[rank1]:     raise ValueError('bad batch')\n",
        b"[rank1]: ValueError: bad batch\n",
        b"diag: dead: rank 1 died in train_step at step 3; rank 0 waits on it\n",
        b"diag: --- diag ended the job here (--on-hang kill: dead, culprit rank 1) ---\n",
        b"Traceback (most recent call last):\n",
        b'  File "/torch/run.py", line 86, in _terminate_process_handler\n',
        b"torch.distributed.elastic.multiprocessing.api.SignalException: Process 9 got signal: 15\n",
    ])
    first, verdict, stopped = scan_file(log)
    assert (first.kind, first.rank) == (Kind.EXCEPTION, 1) and "bad batch" in first.summary
    assert (verdict.kind, verdict.severity, verdict.rank) == (Kind.DIAG_VERDICT, Severity.FAILURE, 1)
    assert (stopped.kind, stopped.severity) == (Kind.AFTER_SHUTDOWN, Severity.NOTE)
    assert "SignalException" in stopped.summary


def test_torchrun_that_saw_its_ranks_end_before_diags_sigterm_is_after_the_shutdown():
    """The other ending of a torchrun job diag ends: torchrun notices its ranks'
    SIGTERM first and raises ChildFailedError ("exitcode: -15"), no SignalException."""
    verdict, stopped = read("torchrun_ended_by_diag_child_failed.log")
    assert (verdict.kind, verdict.severity, verdict.rank) == (Kind.DIAG_VERDICT, Severity.HANG, 1)
    assert verdict.summary.startswith("diag launch: [collective_missing_peers] rank 1 ")
    assert (stopped.kind, stopped.severity) == (Kind.AFTER_SHUTDOWN, Severity.NOTE)
    assert "ChildFailedError" in stopped.summary
