"""The Llama-family decoder (Llama, Qwen2, Mistral), one PP stage's slice of it.

The first stage embeds the tokens; every stage runs its layers; the last stage
applies the final norm and the LM head. Between stages travel the hidden states
and the residual, both [T, hidden_size].
"""
from __future__ import annotations

import torch
from torch import nn

from engine.communicator import Communicator
from engine.model.attention import Attention, AttentionMetadata
from engine.model.config import ModelConfig, check_parallel
from engine.model.embed_head import ParallelLMHead, VocabParallelEmbedding
from engine.model.layernorm import RMSNorm
from engine.model.linear import MergedColumnParallelLinear, QKVParallelLinear, RowParallelLinear, normed_linear
from engine.model.rotary_embedding import RotaryEmbedding
from engine.model.shard import Shard

KVCache = tuple[torch.Tensor, torch.Tensor]


def stage_layers(num_layers: int, pp_rank: int, pp_size: int) -> range:
    """The layers of one PP stage: an even split, the remainder to the earlier stages."""
    base, extra = divmod(num_layers, pp_size)
    start = pp_rank * base + min(pp_rank, extra)
    return range(start, start + base + (pp_rank < extra))


class LlamaAttention(nn.Module):
    def __init__(self, cfg: ModelConfig, comm: Communicator, rotary: RotaryEmbedding,
                 dtype: torch.dtype, device):
        super().__init__()
        self.num_heads = cfg.num_heads // comm.tp_size
        self.num_kv_heads = cfg.num_kv_heads // comm.tp_size
        self.head_dim = cfg.head_dim
        self.qkv_proj = QKVParallelLinear(cfg.hidden_size, cfg.head_dim, cfg.num_heads, cfg.num_kv_heads,
                                          comm, cfg.attention_bias, dtype, device)
        self.o_proj = RowParallelLinear(cfg.num_heads * cfg.head_dim, cfg.hidden_size, comm, dtype, device)
        self.rotary = rotary
        self.attn = Attention(self.num_heads, self.num_kv_heads, cfg.head_dim)

    def forward(self, positions, hidden, residual, norm: RMSNorm | None, kv_cache: KVCache,
                meta: AttentionMetadata):
        """Attention of norm(hidden, residual) (of hidden, normed already, without a norm);
        returns its output and the residual."""
        qkv, residual = normed_linear(hidden, residual, norm, self.qkv_proj)
        q, k, v = self.qkv_proj.split(qkv)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        return self.o_proj(self.attn(positions, q, k, v, self.rotary.cos_sin_cache, kv_cache, meta)), residual

    def shards(self, prefix: str) -> list[Shard]:
        return (self.qkv_proj.shards([f"{prefix}.q_proj", f"{prefix}.k_proj", f"{prefix}.v_proj"])
                + self.o_proj.shards(f"{prefix}.o_proj"))


class LlamaMLP(nn.Module):
    def __init__(self, cfg: ModelConfig, comm: Communicator, dtype: torch.dtype, device):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(cfg.hidden_size, cfg.intermediate_size,
                                                       comm, dtype, device)
        self.down_proj = RowParallelLinear(cfg.intermediate_size, cfg.hidden_size, comm, dtype, device)

    def forward(self, hidden, residual, norm: RMSNorm):
        """The MLP of norm(hidden, residual); returns its output and the residual."""
        hidden, residual = normed_linear(hidden, residual, norm, self.gate_up_proj, then_silu_and_mul=True)
        return self.down_proj(hidden), residual

    def shards(self, prefix: str) -> list[Shard]:
        return (self.gate_up_proj.shards([f"{prefix}.gate_proj", f"{prefix}.up_proj"])
                + self.down_proj.shards(f"{prefix}.down_proj"))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, comm: Communicator, rotary: RotaryEmbedding,
                 dtype: torch.dtype, device):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.self_attn = LlamaAttention(cfg, comm, rotary, dtype, device)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
        self.mlp = LlamaMLP(cfg, comm, dtype, device)

    def forward(self, positions, hidden, residual, kv_cache: KVCache, meta: AttentionMetadata,
                normed: bool = False):
        """hidden: the previous layer's output, or with `normed` input_layernorm's output
        already (the first layer's, fused with the embedding). Each norm runs with the
        product after it (in one kernel where that is a one-row gemv). Returns the MLP's
        output and the residual."""
        hidden, residual = self.self_attn(positions, hidden, residual,
                                          None if normed else self.input_layernorm, kv_cache, meta)
        return self.mlp(hidden, residual, self.post_attention_layernorm)

    def shards(self, prefix: str) -> list[Shard]:
        return (self.input_layernorm.shards(f"{prefix}.input_layernorm")
                + self.self_attn.shards(f"{prefix}.self_attn")
                + self.post_attention_layernorm.shards(f"{prefix}.post_attention_layernorm")
                + self.mlp.shards(f"{prefix}.mlp"))


class LlamaForCausalLM(nn.Module):
    def __init__(self, model_config: ModelConfig, comm: Communicator, dtype: torch.dtype, device):
        super().__init__()
        cfg = model_config
        check_parallel(cfg, comm.tp_size, comm.pp_size)
        self.config = cfg
        self.comm = comm
        self.layer_ids = stage_layers(cfg.num_layers, comm.pp_rank, comm.pp_size)
        rotary = RotaryEmbedding(cfg.head_dim, cfg.max_position_embeddings, cfg.rope_theta,
                                 cfg.rope_scaling, device)
        self.layers = nn.ModuleList(LlamaDecoderLayer(cfg, comm, rotary, dtype, device)
                                    for _ in self.layer_ids)
        self.embed_tokens = self.norm = self.lm_head = None
        if comm.is_first_stage:
            self.embed_tokens = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden_size, comm, dtype, device)
        if comm.is_last_stage:
            self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, dtype, device)
            self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size, comm, dtype, device)
            if cfg.tie_word_embeddings and self.embed_tokens is not None:
                self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor | None, positions: torch.Tensor,
                hidden: torch.Tensor | None, residual: torch.Tensor | None,
                meta: AttentionMetadata, kv_caches: list[KVCache]):
        """The first stage reads input_ids, the others the previous stage's (hidden, residual).
        Returns (hidden, residual) for the next stage, or (final-normed hidden, None) on the last."""
        for i, (layer, kv_cache) in enumerate(zip(self.layers, kv_caches, strict=True)):
            embeds = i == 0 and self.embed_tokens is not None
            if embeds:
                hidden, residual = self.embed_tokens(input_ids, layer.input_layernorm)
            hidden, residual = layer(positions, hidden, residual, kv_cache, meta, normed=embeds)
        if self.norm is not None:
            hidden, residual = self.norm(hidden, residual)[0], None
        return hidden, residual

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """float32 [N, vocab_size], the same on every TP rank of the last stage."""
        return self.lm_head(hidden)

    def kv_cache_shape(self, num_blocks: int, block_size: int) -> tuple[int, int, int, int]:
        """Each layer of this stage has a K and a V cache of this shape."""
        return (num_blocks, block_size, self.config.num_kv_heads // self.comm.tp_size,
                self.config.head_dim)

    def weight_shards(self) -> list[Shard]:
        """Every slice of the checkpoint this rank holds, in HF names."""
        shards = []
        if self.embed_tokens is not None:
            shards += self.embed_tokens.shards("model.embed_tokens")
        for layer_id, layer in zip(self.layer_ids, self.layers):
            shards += layer.shards(f"model.layers.{layer_id}")
        if self.norm is not None:
            shards += self.norm.shards("model.norm")
            if not self.config.tie_word_embeddings:
                shards += self.lm_head.shards("lm_head")
            elif self.embed_tokens is None:
                shards += self.lm_head.shards("model.embed_tokens")
        return shards
