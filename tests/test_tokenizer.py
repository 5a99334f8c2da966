"""Tokenizers: the built-in byte tokenizer, and smollm2's GGUF and HF forms against transformers."""
from __future__ import annotations

import pytest

from engine.model.config import ModelError
from engine.model.loader import resolve_model
from engine.model.tokenizer import Tokenizer

TEXTS = [
    "Hello world",
    "  leading spaces,\ttabs\n\nand blank lines  ",
    "numbers 1234567 and 3.14159; don't we'll",
    "unicode: café, naïve, 日本語, emoji 🙂",
    "<|im_start|>user\nhi<|im_end|>\n<|endoftext|>",
    "def f(x):\n    return x**2  # comment",
]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"},
            {"role": "assistant", "content": "4"}, {"role": "user", "content": "And 3+3?"}]


def test_byte_tokenizer_round_trips_and_adds_bos():
    tokenizer = Tokenizer.byte_level()
    ids = tokenizer.encode("héllo 🙂")
    assert ids == [256, *"héllo 🙂".encode()]
    assert tokenizer.decode(ids) == "héllo 🙂"
    assert tokenizer.decode(ids, skip_special_tokens=False) == "<|bos|>héllo 🙂"
    assert tokenizer.encode("hi", add_special_tokens=False) == [104, 105]
    assert (tokenizer.bos_token_id, tokenizer.eos_token_ids, tokenizer.vocab_size) == (256, [257], 261)


def test_byte_tokenizer_chat_template_uses_special_tokens():
    tokenizer = Tokenizer.byte_level()
    prompt = tokenizer.apply_chat_template(MESSAGES[1:2])
    assert prompt == "<|bos|><|user|>What is 2+2?<|eos|><|assistant|>"
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    assert ids[:2] == [256, 259] and ids[-2:] == [257, 260]


@pytest.fixture(scope="module")
def smollm2():
    from transformers import AutoTokenizer
    source = resolve_model("smollm2-135m")
    hf = AutoTokenizer.from_pretrained(source.path.parent, gguf_file=source.path.name)
    return source, hf


def assert_same_as_transformers(ours: Tokenizer, hf):
    for text in TEXTS:
        ids = hf(text)["input_ids"]
        assert ours.encode(text) == ids, text
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True), text
    for messages in (MESSAGES, MESSAGES[1:2]):
        assert ours.apply_chat_template(messages) == hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True)


@pytest.mark.e2e
def test_gguf_tokenizer_matches_transformers(smollm2):
    source, hf = smollm2
    ours = source.tokenizer()
    assert_same_as_transformers(ours, hf)
    assert ours.eos_token_ids == [hf.eos_token_id] == [2]
    assert ours.vocab_size == len(hf) == 49152


@pytest.mark.e2e
def test_hf_dir_tokenizer_matches_transformers(smollm2, tmp_path):
    source, hf = smollm2
    hf.save_pretrained(tmp_path)
    assert_same_as_transformers(Tokenizer.from_hf_dir(tmp_path, source.model_config), hf)


def test_hf_dir_without_tokenizer_json_is_an_error(tmp_path):
    with pytest.raises(ModelError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path, resolve_model("tiny-llama").model_config)
