"""Command-line flags shared by `python -m engine generate|serve|bench`, spelled as vLLM's.

As with vLLM, a flag may be written with underscores (`--tensor_parallel_size 2`),
and token counts and byte sizes take vLLM's suffixes: k, m, g, t are powers of 1000,
K, M, G, T powers of 1024 (`--max-model-len 4k` is 4000, `4K` is 4096).
"""
from __future__ import annotations

import argparse
import re
from dataclasses import fields

from engine.config import EngineConfig

DTYPE_ALIASES = {"half": "float16", "float": "float32"}    # vLLM's other spellings
LOAD_FORMAT_ALIASES = {"safetensors": "hf"}
_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_BINARY = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
_SUFFIXED = re.compile(r"(\d+(?:\.\d+)?)([kmgtKMGT])")


def human_int(text: str) -> int:
    """A whole number, or one with vLLM's suffixes: 25.6k is 25600, 4K is 4096."""
    match = _SUFFIXED.fullmatch(text.strip())
    if match is None:
        try:
            return int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected a whole number such as 4096, 4k (4000) or 4K (4096), not {text!r}") from None
    number, suffix = match.groups()
    if suffix in _DECIMAL:
        return int(float(number) * _DECIMAL[suffix])
    if "." in number:
        raise argparse.ArgumentTypeError(f"{text!r}: a binary suffix takes no decimals; "
                                         f"did you mean {number}{suffix.lower()}?")
    return int(number) * _BINARY[suffix]


def model_len(text: str) -> int | None:
    """--max-model-len: as human_int, and `auto` or -1 (vLLM's) for the model's own."""
    return None if text.strip().lower() in ("auto", "-1") else human_int(text)


def _alias(aliases: dict[str, str]):
    return lambda text: aliases.get(text, text)


def add_engine_args(parser: argparse.ArgumentParser, positional_model: bool = False) -> None:
    """The engine's flags; with positional_model (serve), the model is `MODEL` or --model,
    and has no default."""
    d = EngineConfig()
    a = parser.add_argument
    model_help = ("a HF model directory, a .gguf file, smollm2-135m (embedded real weights) or a "
                  "named config with random weights (tiny-llama, tiny-qwen2, llama-3.2-1b, llama-3.1-8b)")
    if positional_model:
        a("model_tag", nargs="?", metavar="MODEL", help=f"what to serve: {model_help}")
        a("--model", default=None, help="the same as MODEL (vLLM's older spelling)")
    else:
        a("--model", default=d.model, help=f"{model_help} (default: %(default)s)")
    a("--load-format", default=d.load_format, type=_alias(LOAD_FORMAT_ALIASES),
      choices=["auto", "dummy", "hf", "gguf"],
      help="where the weights come from: auto (the model's own), dummy (random, the model's shapes), "
           "hf (safetensors; vLLM's 'safetensors' too) or gguf")
    a("--dtype", default=d.dtype, type=_alias(DTYPE_ALIASES),
      choices=["auto", "float32", "bfloat16", "float16"],
      help="auto: float32 on CPU, bfloat16 on GPU (vLLM's 'half' and 'float' too)")
    a("--device", default=d.device, choices=["auto", "cpu", "cuda"], help="auto: cuda if there is a GPU")
    a("-tp", "--tensor-parallel-size", type=int, default=d.tensor_parallel_size,
      help="ranks each layer is split over")
    a("-pp", "--pipeline-parallel-size", type=int, default=d.pipeline_parallel_size,
      help="pipeline stages the layers are split into")
    a("--max-num-batched-tokens", type=human_int, default=d.max_num_batched_tokens,
      help="tokens one engine step computes at most (default: %(default)s)")
    a("--max-num-seqs", type=int, default=d.max_num_seqs,
      help="requests in one batch at most (default: %(default)s)")
    a("--block-size", type=int, default=d.block_size, help="tokens per KV cache block")
    a("--max-model-len", type=model_len, default=d.max_model_len,
      help="context length: prompt plus output tokens (default and 'auto': the model's own, "
           "at most 4096)")
    a("--gpu-memory-utilization", "--device-memory-utilization", type=float,
      default=d.gpu_memory_utilization,
      help="the KV cache's share, in (0, 1], of the GPU memory free after the weights are loaded "
           "(default: %(default)s; vLLM's counts the whole GPU). No effect on CPU, where the KV "
           "cache takes --kv-cache-memory-bytes")
    a("--num-gpu-blocks-override", type=int, default=d.num_gpu_blocks_override,
      help="KV cache blocks, instead of what the memory budget holds")
    a("--kv-cache-memory-bytes", type=human_int, default=d.kv_cache_memory_bytes,
      help="the KV cache's size per rank, e.g. 2G (default: 1 GiB on CPU; on GPU see "
           "--gpu-memory-utilization)")
    a("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=d.enable_prefix_caching,
      help="reuse the KV blocks of a prompt prefix seen before (default: on)")
    a("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=d.enable_chunked_prefill,
      help="split a long prompt over several steps (default: on)")
    a("--max-concurrent-batches", type=int, default=d.max_concurrent_batches,
      help="batches in flight at once (default: the pipeline's stages; 2 at pp=1 with async "
           "scheduling)")
    a("--async-scheduling", action=argparse.BooleanOptionalAction, default=d.async_scheduling,
      help="schedule the next step while one runs, as vLLM V1 does (default: on)")
    a("--enforce-eager", action=argparse.BooleanOptionalAction, default=d.enforce_eager,
      help="no CUDA graphs for decode batches")
    a("--seed", type=int, default=d.seed, help="of the dummy weights and of sampling")
    nodes = parser.add_argument_group("multi-node (node 0 is the head; the others run headless)")
    nodes.add_argument("-n", "--nnodes", type=int, default=d.nnodes,
                       help="machines the ranks are spread over")
    nodes.add_argument("-r", "--node-rank", type=int, default=d.node_rank,
                       help="this machine's index; it runs ranks [node-rank * k, (node-rank + 1) * k)")
    nodes.add_argument("--master-addr", default=d.master_addr,
                       help="the head's address: torch.distributed's rendezvous and the node links")
    nodes.add_argument("--master-port", type=int, default=d.master_port,
                       help="rendezvous port; the head also listens on port + 1 (default: free port, one node only)")
    nodes.add_argument("--node-timeout", type=float, default=d.node_timeout,
                       help="seconds to wait for the other nodes to join")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})


def add_bench_args(parser: argparse.ArgumentParser) -> None:
    a = parser.add_argument
    a("--num-prompts", type=int, default=32, help="requests, all arriving at once")
    a("--input-len", type=int, default=128, help="prompt tokens per request")
    a("--output-len", type=int, default=64, help="generated tokens per request (EOS ignored)")
    a("--sweep", metavar="FLAG=V1,V2,...", help="one run per value, e.g. max-num-batched-tokens=512,2048,8192")
    a("--json", action="store_true", help="print the results as JSON on stdout (the table goes to stderr)")
    a("-o", "--output", metavar="FILE", help="write the results as JSON to FILE")
    a("--plot", metavar="FILE.png", help="plot TTFT, ITL and throughput per run (needs matplotlib)")
