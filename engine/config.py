"""The engine's settings. Flag names follow vLLM's where the meaning is the same."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class EngineConfig:
    model: str = "tiny-llama"
    load_format: str = "auto"            # auto, dummy, hf, gguf
    dtype: str = "auto"                  # auto (fp32 on CPU, bf16 on GPU), float32, bfloat16, float16
    device: str = "auto"                 # auto, cpu, cuda
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_num_batched_tokens: int = 512
    max_num_seqs: int = 64
    block_size: int = 16
    max_model_len: int | None = None     # None: the model's own, capped at 4096
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None  # None: 1 GiB on CPU, gpu_memory_utilization on GPU
    gpu_memory_utilization: float = 0.85  # the KV cache's share of the GPU memory left free by the weights
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_concurrent_batches: int | None = None  # None: pipeline_parallel_size, or 2 with async scheduling at pp=1
    async_scheduling: bool = True        # schedule the next batch while one runs (scheduler.py)
    enforce_eager: bool = False
    seed: int = 0
    nnodes: int = 1
    node_rank: int = 0                   # 0: the head (scheduler + its workers); > 0: headless
    master_addr: str = "127.0.0.1"       # torch.distributed's rendezvous; the head listens on it
    master_port: int | None = None       # None: any free port (one node only)
    node_timeout: float = 120.0          # seconds the head waits for every node to join

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nnodes

    def node_ranks(self, node_rank: int) -> range:
        """The global ranks node node_rank runs: a contiguous block."""
        return range(node_rank * self.ranks_per_node, (node_rank + 1) * self.ranks_per_node)

    @property
    def batch_queue_size(self) -> int:
        if self.max_concurrent_batches:
            return self.max_concurrent_batches
        if self.pipeline_parallel_size == 1 and self.async_scheduling:
            return 2
        return self.pipeline_parallel_size

    def validate(self) -> None:
        """Raise ValueError with a one-line message for settings that cannot work."""
        positive = {
            "--tensor-parallel-size": self.tensor_parallel_size,
            "--pipeline-parallel-size": self.pipeline_parallel_size,
            "--max-num-batched-tokens": self.max_num_batched_tokens,
            "--max-num-seqs": self.max_num_seqs,
            "--block-size": self.block_size,
            "--max-concurrent-batches": self.batch_queue_size,
        }
        for flag, value in positive.items():
            if value < 1:
                raise ValueError(f"{flag} must be at least 1, got {value}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("--gpu-memory-utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization:g}")
        if self.load_format not in ("auto", "dummy", "hf", "gguf"):
            raise ValueError(f"--load-format must be auto, dummy, hf or gguf, got {self.load_format!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        self._validate_nodes()
        if not self.enable_chunked_prefill and self.max_model_len and \
                self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill, --max-num-batched-tokens must be at least "
                             f"--max-model-len ({self.max_model_len})")

    def _validate_nodes(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"--nnodes must be at least 1, got {self.nnodes}")
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"--node-rank must be in 0..{self.nnodes - 1} "
                             f"(--nnodes {self.nnodes}), got {self.node_rank}")
        if self.world_size % self.nnodes:
            raise ValueError(f"--nnodes {self.nnodes} does not divide the {self.world_size} ranks "
                             f"(tp {self.tensor_parallel_size} x pp {self.pipeline_parallel_size})")
        if self.nnodes > 1 and self.master_port is None:
            raise ValueError("--master-port is required with --nnodes > 1 "
                             "(every node must name the same port)")
        if self.master_port is not None and not 1 <= self.master_port < 65535:
            raise ValueError(f"--master-port must be in 1..65534 (the head also listens on "
                             f"port + 1), got {self.master_port}")
        if self.node_timeout <= 0:
            raise ValueError(f"--node-timeout must be positive, got {self.node_timeout:g}")
