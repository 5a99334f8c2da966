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
    kv_cache_memory_bytes: int | None = None  # None: 1 GiB on CPU, free memory share on GPU
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    max_concurrent_batches: int | None = None  # None: pipeline_parallel_size
    enforce_eager: bool = False
    seed: int = 0

    @property
    def world_size(self) -> int:
        return self.tensor_parallel_size * self.pipeline_parallel_size

    @property
    def batch_queue_size(self) -> int:
        return self.max_concurrent_batches or self.pipeline_parallel_size

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
        if self.load_format not in ("auto", "dummy", "hf", "gguf"):
            raise ValueError(f"--load-format must be auto, dummy, hf or gguf, got {self.load_format!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype must be auto, float32, bfloat16 or float16, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ValueError(f"--device must be auto, cpu or cuda, got {self.device!r}")
        if not self.enable_chunked_prefill and self.max_model_len and \
                self.max_num_batched_tokens < self.max_model_len:
            raise ValueError("without chunked prefill, --max-num-batched-tokens must be at least "
                             f"--max-model-len ({self.max_model_len})")
