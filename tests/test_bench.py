"""python -m engine bench on tiny-llama: the sweep's line per run, table, JSON (printed
and written) and plot (or the note that matplotlib is missing), and one-line errors for
bad flags."""
import importlib.util
import json
import subprocess
import sys

import pytest

from engine.bench.bench import bench_main
from engine.entrypoints.args import config_from_args
from engine.entrypoints.cli import parse

NUM_PROMPTS, OUTPUT_LEN = 4, 4


def bench(*argv: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine", "bench", "--model", "tiny-llama", *argv],
                          capture_output=True, text=True, timeout=timeout)


def test_sweep_prints_each_run_then_the_json_and_writes_it_and_the_plot(tmp_path):
    json_path, png_path = tmp_path / "sweep.json", tmp_path / "sweep.png"
    result = bench("--num-prompts", str(NUM_PROMPTS), "--input-len", "24", "--output-len", str(OUTPUT_LEN),
                   "--sweep", "max-num-batched-tokens=16,64", "--json", "-o", str(json_path),
                   "--plot", str(png_path))
    assert result.returncode == 0, result.stderr
    # --json: stdout is the JSON alone; the table goes to stderr, after a line per run
    assert json.loads(result.stdout) == json.loads(json_path.read_text())
    runs = [line for line in result.stderr.splitlines() if line.startswith("run ")]
    assert [line.partition(":")[0] for line in runs] == [
        "run 1/2, max-num-batched-tokens=16", "run 2/2, max-num-batched-tokens=64"]
    assert all("req/s" in line and "ITL ms p50/p90/p99" in line for line in runs)
    assert "engine bench" in result.stderr and "max-num-batched-tokens" in result.stderr
    assert "p50 latency" in result.stderr and "█" in result.stderr
    assert result.stderr.index(runs[-1]) < result.stderr.index("engine bench")

    report = json.loads(json_path.read_text())
    assert report["schema_version"] == 1
    assert report["sweep"] == "max-num-batched-tokens=16,64"
    assert report["workload"]["num_prompts"] == NUM_PROMPTS
    assert [r["label"] for r in report["results"]] == ["16", "64"]
    for run in report["results"]:
        assert run["num_requests"] == NUM_PROMPTS
        assert run["output_tokens"] == NUM_PROMPTS * OUTPUT_LEN
        assert run["output_tokens_per_s"] > 0 and run["requests_per_s"] > 0
        for key in ("ttft_ms", "itl_ms"):
            p = run[key]
            assert 0 < p["p50"] <= p["p90"] <= p["p99"]

    if importlib.util.find_spec("matplotlib"):
        assert png_path.read_bytes().startswith(b"\x89PNG")
    else:
        assert "matplotlib is not installed" in result.stderr and not png_path.exists()


@pytest.mark.parametrize("argv, message", [
    (["--sweep", "max-num-blocks=1,2"], "--sweep 'max-num-blocks=1,2': expected FLAG=V1,V2"),
    (["--sweep", "max-num-seqs=1,many"], "the values must be integers"),
    (["--num-prompts", "0"], "--num-prompts must be at least 1"),
    (["--sweep", "max-num-seqs=4,0"], "--max-num-seqs must be at least 1, got 0"),
])
def test_bad_flags_are_one_line_errors(argv, message):
    result = bench(*argv, timeout=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]


def test_a_bad_output_path_fails_before_any_run(tmp_path):
    path = tmp_path / "missing" / "out.json"
    with pytest.raises(ValueError, match=f"^-o {path}: No such file or directory$"):
        args = parse(["bench", "--model", "tiny-llama", "-o", str(path)])
        bench_main(args, config_from_args(args))
