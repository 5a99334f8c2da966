"""`python -m engine`'s command line, parsed in-process: vLLM's spellings (positional
model, underscores, k/K suffixes), the one-line errors (exit 2) for vLLM flags the engine
does not have and for other bad usage, --version, help on every argument."""
from __future__ import annotations

import argparse
from importlib import metadata

import pytest

from engine.entrypoints.args import config_from_args
from engine.entrypoints.cli import NO_MODEL, build_parser, parse
from engine.entrypoints.vllm_flags import vllm_serve_flags


def refused(capsys, argv: list[str]) -> str:
    """The one line a bad command line gets, after checking it exits 2 with nothing on stdout."""
    with pytest.raises(SystemExit) as exit_:
        parse(argv)
    out, err = capsys.readouterr()
    assert (exit_.value.code, out) == (2, "")
    assert err.count("\n") == 1, err
    return err.strip()


def test_version(capsys):
    with pytest.raises(SystemExit) as exit_:
        parse(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"python -m engine (hangscope) {metadata.version('hangscope')}\n"


def test_a_vllm_docs_command_line_parses_as_vllm_reads_it():
    args = parse(["serve", "meta-llama/Llama-3.1-8B", "--max-model-len", "4k", "-tp", "2",
                  "--pipeline_parallel_size=2", "--max_num_batched_tokens", "8K",
                  "--kv-cache-memory-bytes", "1.5g", "--gpu_memory_utilization", "0.5",
                  "--dtype", "half", "--load-format", "safetensors", "--no-enable-prefix-caching"])
    config = config_from_args(args)
    assert config.model == "meta-llama/Llama-3.1-8B"
    assert (config.max_model_len, config.max_num_batched_tokens) == (4000, 8192)
    assert (config.tensor_parallel_size, config.pipeline_parallel_size) == (2, 2)
    assert config.kv_cache_memory_bytes == 1_500_000_000
    assert (config.gpu_memory_utilization, config.dtype, config.load_format) == (0.5, "float16", "hf")
    assert not config.enable_prefix_caching
    assert args.host is None        # vLLM's default: every interface


@pytest.mark.parametrize("value, tokens", [("4K", 4096), ("25.6k", 25600), ("2m", 2_000_000),
                                           ("512", 512), ("auto", None), ("-1", None)])
def test_max_model_len_takes_vllms_suffixes(value, tokens):
    assert parse(["serve", "m", "--max-model-len", value]).max_model_len == tokens


def test_the_model_as_flag_or_positional():
    assert parse(["serve", "--model", "m"]).model == "m"
    assert parse(["serve", "m", "--model", "m"]).model == "m"
    assert parse(["generate", "--prompt", "hi"]).model == "tiny-llama"   # offline keeps its default


@pytest.mark.parametrize("argv, line", [
    (["serve", "m", "--quantization", "awq", "--lora_modules", "a=b", "-q", "awq"],
     "python -m engine serve: these vLLM flags are not supported here: --quantization, --lora-modules, -q"),
    (["serve", "--enable-lora", "m"],
     "python -m engine serve: these vLLM flags are not supported here: --enable-lora"),
    (["bench", "--speculative-config={}"],
     "python -m engine bench: these vLLM flags are not supported here: --speculative-config"),
    (["serve", "m", "--quantization", "awq", "--frobnicate"],
     "python -m engine serve: error: unrecognized arguments: --frobnicate"),
    (["serve", "m", "extra"], "python -m engine serve: error: unrecognized arguments: extra"),
    (["serve"], f"python -m engine serve: error: {NO_MODEL}"),
    (["serve", "a", "--model", "b"],
     "python -m engine serve: error: two models given, a and --model b: give one"),
    (["serve", "m", "--headless"], "python -m engine serve: error: --headless is for the nodes that run "
     "no API server (--node-rank 1 and up); node 0 is the head, which serves the API"),
    (["serve", "m", "--max-model-len", "1.5K"], "python -m engine serve: error: argument --max-model-len: "
     "'1.5K': a binary suffix takes no decimals; did you mean 1.5k?"),
    (["serve", "m", "--max-num-batched-tokens", "lots"], "python -m engine serve: error: argument "
     "--max-num-batched-tokens: expected a whole number such as 4096, 4k (4000) or 4K (4096), not 'lots'"),
    ([], "python -m engine: error: the following arguments are required: {generate,serve,bench}"),
])
def test_bad_usage_is_one_line_and_exit_2(capsys, argv, line):
    assert refused(capsys, argv) == line


def test_headless_is_for_other_nodes():
    args = parse(["serve", "m", "--headless", "--nnodes", "2", "--node-rank", "1", "--master-port", "29500"])
    assert args.headless and args.node_rank == 1


@pytest.mark.parametrize("fraction", ["0", "1.5", "nan"])
def test_gpu_memory_utilization_is_a_fraction(fraction):
    config = config_from_args(parse(["serve", "m", "--gpu-memory-utilization", fraction]))
    with pytest.raises(ValueError, match=r"--gpu-memory-utilization must be in \(0, 1\]"):
        config.validate()


def test_every_flag_we_share_with_vllm_is_one_of_its_serve_flags():
    """The list is real vLLM's: the flags that mean the same here are in it."""
    _, commands = build_parser()
    serve = {flag for action in commands["serve"]._actions for flag in action.option_strings}
    assert len(vllm_serve_flags()) > 400
    # ours alone: the server's limits on what one client may send (#27), and three more
    assert serve - vllm_serve_flags() == {"--device", "--max-concurrent-batches", "--node-timeout",
                                          "--max-prompt-chars", "--idle-timeout"}


def test_every_argument_has_help():
    parser, commands = build_parser()
    for name, command in [("", parser), *commands.items()]:
        bare = [action.dest for action in command._actions
                if not action.help and not isinstance(action, argparse._SubParsersAction)]
        assert not bare, (name, bare)
