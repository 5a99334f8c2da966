"""Command-line flags shared by `python -m engine generate|serve|bench` (vLLM's names)."""
from __future__ import annotations

import argparse
from dataclasses import fields

from engine.config import EngineConfig


def add_engine_args(parser: argparse.ArgumentParser) -> None:
    d = EngineConfig()
    a = parser.add_argument
    a("--model", default=d.model, help="named config (tiny-llama, smollm2-135m, ...), HF dir or .gguf")
    a("--load-format", default=d.load_format, choices=["auto", "dummy", "hf", "gguf"])
    a("--dtype", default=d.dtype, choices=["auto", "float32", "bfloat16", "float16"])
    a("--device", default=d.device, choices=["auto", "cpu", "cuda"])
    a("-tp", "--tensor-parallel-size", type=int, default=d.tensor_parallel_size)
    a("-pp", "--pipeline-parallel-size", type=int, default=d.pipeline_parallel_size)
    a("--max-num-batched-tokens", type=int, default=d.max_num_batched_tokens)
    a("--max-num-seqs", type=int, default=d.max_num_seqs)
    a("--block-size", type=int, default=d.block_size)
    a("--max-model-len", type=int, default=d.max_model_len)
    a("--num-gpu-blocks-override", type=int, default=d.num_gpu_blocks_override)
    a("--kv-cache-memory-bytes", type=int, default=d.kv_cache_memory_bytes)
    a("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false")
    a("--no-enable-chunked-prefill", dest="enable_chunked_prefill", action="store_false")
    a("--max-concurrent-batches", type=int, default=d.max_concurrent_batches)
    a("--no-async-scheduling", dest="async_scheduling", action="store_false")
    a("--enforce-eager", action="store_true")
    a("--seed", type=int, default=d.seed)
    nodes = parser.add_argument_group("multi-node (node 0 is the head; the others run headless)")
    nodes.add_argument("--nnodes", type=int, default=d.nnodes, help="machines the ranks are spread over")
    nodes.add_argument("--node-rank", type=int, default=d.node_rank,
                       help="this machine's index; it runs ranks [node-rank * k, (node-rank + 1) * k)")
    nodes.add_argument("--master-addr", default=d.master_addr,
                       help="the head's address: torch.distributed's rendezvous and the node links")
    nodes.add_argument("--master-port", type=int, default=d.master_port,
                       help="rendezvous port; the head also listens on port + 1 (default: free port, one node only)")
    nodes.add_argument("--node-timeout", type=float, default=d.node_timeout,
                       help="seconds to wait for the other nodes to join")


def config_from_args(args: argparse.Namespace) -> EngineConfig:
    return EngineConfig(**{f.name: getattr(args, f.name) for f in fields(EngineConfig)})
