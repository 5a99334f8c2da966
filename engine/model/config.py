"""The model's architecture: what the layers need to know, whatever the weights' format."""
from __future__ import annotations

from dataclasses import dataclass, field


class ModelError(Exception):
    """A model that cannot be found, read or run as asked. The message is one line."""


@dataclass
class ModelConfig:
    name: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None      # None, or {"rope_type": "linear" | "llama3", ...} as in HF,
                                          # or {"rope_type": "freq_factors", "factors": [...]} (GGUF)
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False          # bias on the q, k, v projections (Qwen2)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def from_hf_config(cls, hf: dict, name: str) -> ModelConfig:
        """From a HF config.json dict (model_type llama, qwen2 or mistral)."""
        model_type = hf.get("model_type")
        if model_type not in ("llama", "qwen2", "mistral"):
            raise ModelError(f"{name}: model_type {model_type!r} is not supported (llama, qwen2, mistral)")
        if hf.get("hidden_act", "silu") != "silu":
            raise ModelError(f"{name}: hidden_act {hf['hidden_act']!r} is not supported (silu)")
        # transformers 5 writes rope_parameters; older files have rope_theta + rope_scaling.
        rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        rope_theta = rope.pop("rope_theta", hf.get("rope_theta", 10000.0))
        max_positions = hf.get("max_position_embeddings", 4096)
        if model_type == "mistral" and hf.get("sliding_window"):
            # Inside the window, sliding-window attention is full attention.
            max_positions = min(max_positions, hf["sliding_window"])
        num_heads = hf["num_attention_heads"]
        eos = hf.get("eos_token_id")
        return cls(
            name=name,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_layers=hf["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=hf.get("num_key_value_heads") or num_heads,
            head_dim=hf.get("head_dim") or hf["hidden_size"] // num_heads,
            rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
            rope_theta=float(rope_theta),
            rope_scaling=_rope_scaling(rope, name),
            max_position_embeddings=max_positions,
            tie_word_embeddings=hf.get("tie_word_embeddings", False),
            attention_bias=model_type == "qwen2" or hf.get("attention_bias", False),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=[] if eos is None else list(eos) if isinstance(eos, list) else [eos],
        )

    @classmethod
    def from_gguf_metadata(cls, meta: dict, name: str, tied: bool) -> ModelConfig:
        """From a GGUF file's metadata (architecture llama). `tied`: the file has no output.weight."""
        arch = meta.get("general.architecture")
        if arch != "llama":
            raise ModelError(f"{name}: GGUF architecture {arch!r} is not supported (llama)")
        hidden = int(meta["llama.embedding_length"])
        num_heads = int(meta["llama.attention.head_count"])
        rope = {}
        if meta.get("llama.rope.scaling.type") == "linear":
            rope = {"rope_type": "linear", "factor": float(meta["llama.rope.scaling.factor"])}
        eos = meta.get("tokenizer.ggml.eos_token_id")
        return cls(
            name=name,
            vocab_size=int(meta.get("llama.vocab_size") or len(meta["tokenizer.ggml.tokens"])),
            hidden_size=hidden,
            intermediate_size=int(meta["llama.feed_forward_length"]),
            num_layers=int(meta["llama.block_count"]),
            num_heads=num_heads,
            num_kv_heads=int(meta.get("llama.attention.head_count_kv", num_heads)),
            head_dim=int(meta.get("llama.rope.dimension_count", hidden // num_heads)),
            rms_norm_eps=float(meta["llama.attention.layer_norm_rms_epsilon"]),
            rope_theta=float(meta.get("llama.rope.freq_base", 10000.0)),
            rope_scaling=_rope_scaling(rope, name),
            max_position_embeddings=int(meta.get("llama.context_length", 4096)),
            tie_word_embeddings=tied,
            bos_token_id=meta.get("tokenizer.ggml.bos_token_id"),
            eos_token_ids=[] if eos is None else [int(eos)],
        )


def _rope_scaling(rope: dict, name: str) -> dict | None:
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type == "default":
        return None
    if rope_type not in ("linear", "llama3"):
        raise ModelError(f"{name}: rope scaling {rope_type!r} is not supported (linear, llama3)")
    return {**rope, "rope_type": rope_type}


def check_parallel(cfg: ModelConfig, tp: int, pp: int) -> None:
    """Raise ModelError when the model cannot be split tp x pp ways."""
    if cfg.num_heads % tp or cfg.num_kv_heads % tp:
        working = [n for n in range(1, cfg.num_kv_heads + 1)
                   if cfg.num_heads % n == 0 and cfg.num_kv_heads % n == 0]
        raise ModelError(
            f"{cfg.name} has {cfg.num_heads} attention heads and {cfg.num_kv_heads} KV heads: "
            f"--tensor-parallel-size {tp} does not divide them; sizes that work: "
            + ", ".join(map(str, working)))
    if pp > cfg.num_layers:
        raise ModelError(f"{cfg.name} has {cfg.num_layers} layers: "
                         f"--pipeline-parallel-size {pp} is more than that")


LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}

# Named configs run with random weights and the built-in byte tokenizer, so they take its ids.
_BYTE_TOKENS = dict(bos_token_id=256, eos_token_ids=[257])
_TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=8, num_heads=4,
             num_kv_heads=2, head_dim=16, rms_norm_eps=1e-6, **_BYTE_TOKENS)

NAMED_CONFIGS: dict[str, ModelConfig] = {
    "tiny-llama": ModelConfig(name="tiny-llama", **_TINY),
    "tiny-qwen2": ModelConfig(name="tiny-qwen2", attention_bias=True, **_TINY),
    "llama-3.2-1b": ModelConfig(
        name="llama-3.2-1b", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
        num_layers=16, num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=500000.0,
        rope_scaling=LLAMA3_ROPE, max_position_embeddings=131072, tie_word_embeddings=True,
        **_BYTE_TOKENS),
    "llama-3.1-8b": ModelConfig(
        name="llama-3.1-8b", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
        num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=500000.0,
        rope_scaling={**LLAMA3_ROPE, "factor": 8.0}, max_position_embeddings=131072,
        **_BYTE_TOKENS),
}
