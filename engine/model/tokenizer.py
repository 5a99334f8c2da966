"""Text <-> token ids, and the model's chat template.

Every source ends up as a `tokenizers.Tokenizer` whose post-processor adds BOS
where the model wants it: a HF directory's tokenizer.json as it is, a GGUF
file's vocabulary and merges rebuilt the way transformers rebuilds them, or a
built-in byte-level tokenizer for the named dummy configs.
"""
from __future__ import annotations

import functools
import json
from datetime import datetime
from pathlib import Path

import jinja2
import jinja2.sandbox
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as Backend

from engine.model.config import ModelConfig, ModelError


class Tokenizer:
    def __init__(self, backend: Backend, bos_token_id: int | None, eos_token_ids: list[int],
                 chat_template: str | None):
        self.backend = backend
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self.chat_template = chat_template

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`, with BOS first if the model wants it. A rendered chat prompt
        already holds its special tokens: encode it with add_special_tokens=False. It
        goes through encode_batch, which lets other threads run while it works (encode
        holds the GIL: a 4 MB prompt would stall the server's event loop for seconds)."""
        return self.backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self.chat_template is None:
            raise ModelError("this model has no chat template")
        template = _compile_template(self.chat_template)
        try:
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt,
                                   bos_token=self._token(self.bos_token_id),
                                   eos_token=self._token(self.eos_token_ids[0] if self.eos_token_ids else None))
        except jinja2.TemplateError as error:
            raise ModelError(f"chat template failed: {error}") from None

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else self.backend.id_to_token(token_id)

    @classmethod
    def from_hf_dir(cls, path: Path, model_config: ModelConfig) -> Tokenizer:
        if not (path / "tokenizer.json").is_file():
            raise ModelError(f"{path}: no tokenizer.json")
        backend = Backend.from_file(str(path / "tokenizer.json"))
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        bos = _special_id(backend, config.get("bos_token"))
        eos = _special_id(backend, config.get("eos_token"))
        # The tokenizer's own EOS first: it is the one chat templates write.
        eos_ids = list(dict.fromkeys([*([eos] if eos is not None else []), *model_config.eos_token_ids]))
        return cls(backend, bos if bos is not None else model_config.bos_token_id, eos_ids,
                   _hf_chat_template(path, config))

    @classmethod
    def from_gguf_metadata(cls, meta: dict) -> Tokenizer:
        """A gpt2-style BPE tokenizer from GGUF metadata, with the ids transformers gives it."""
        kind = meta.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ModelError(f"GGUF tokenizer {kind!r} is not supported (gpt2-style BPE only)")
        alphabet = _byte_alphabet()
        letters = set(alphabet)
        tokens = meta["tokenizer.ggml.tokens"]
        spelled = [token if set(token) <= letters else "".join(alphabet[b] for b in token.encode())
                   for token in tokens]
        merges = [tuple(merge.split(" ")) for merge in meta["tokenizer.ggml.merges"]]
        backend = Backend(models.BPE(vocab={t: i for i, t in enumerate(spelled)}, merges=merges,
                                     fuse_unk=False))
        split = _PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False) if split is None else \
            pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(split), behavior="isolated"),
                                     pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        backend.decoder = decoders.ByteLevel()
        # Token types as llama.cpp writes them: 3 control (special), 4 user-defined (kept whole).
        types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t, s, tt in zip(tokens, spelled, types) if tt == 3 and t == s])
        backend.add_tokens([AddedToken(t, normalized=False) for t, tt in zip(tokens, types) if tt == 4])
        bos = meta.get("tokenizer.ggml.bos_token_id")
        if meta.get("tokenizer.ggml.add_bos_token", False) and bos is not None:
            _add_bos(backend, int(bos))
        eos_ids = [int(meta[key]) for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
                   if key in meta]
        return cls(backend, None if bos is None else int(bos), list(dict.fromkeys(eos_ids)),
                   meta.get("tokenizer.chat_template"))

    @classmethod
    def byte_level(cls) -> Tokenizer:
        """256 byte tokens, then BYTE_SPECIAL_TOKENS (BOS 256, EOS 257, role markers)."""
        alphabet = _byte_alphabet()
        backend = Backend(models.BPE(vocab={c: b for b, c in enumerate(alphabet)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, normalized=False, special=True)
                                    for t in BYTE_SPECIAL_TOKENS])
        _add_bos(backend, 256)
        return cls(backend, 256, [257], BYTE_CHAT_TEMPLATE)


BYTE_SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|system|>", "<|user|>", "<|assistant|>"]
BYTE_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>{{ message['content'] }}"
    "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

# How llama.cpp's pre-tokenizer types split text before BPE; others use GPT-2's split.
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_PRE_TOKENIZER_SPLITS = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def _byte_alphabet() -> list[str]:
    """GPT-2's byte-level spelling: byte b is written as the character alphabet[b]. Printable
    Latin-1 bytes stand for themselves; the rest are moved past 255 in order."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)}
    moved = iter(range(256, 512))
    return [chr(b) if b in printable else chr(next(moved)) for b in range(256)]


def _add_bos(backend: Backend, bos_id: int) -> None:
    bos = backend.id_to_token(bos_id)
    backend.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, bos_id)])


def _special_id(backend: Backend, token: str | dict | None) -> int | None:
    if isinstance(token, dict):
        token = token.get("content")
    return None if token is None else backend.token_to_id(token)


def _hf_chat_template(path: Path, config: dict) -> str | None:
    if (path / "chat_template.jinja").is_file():
        return (path / "chat_template.jinja").read_text()
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        template = {t["name"]: t["template"] for t in template}.get("default")
    return template


@functools.lru_cache(maxsize=8)
def _compile_template(source: str) -> jinja2.Template:
    """Compiled as transformers compiles chat templates, with the globals they may call."""
    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = _raise_template_error
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as error:
        raise ModelError(f"chat template does not compile: {error}") from None


def _raise_template_error(message: str):
    raise jinja2.TemplateError(message)
