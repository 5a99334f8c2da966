"""The log of `python -m engine serve`, on stderr: what it serves (before and after the
workers start), where it listens, and an access line per request as uvicorn writes
them for vLLM (`"POST /v1/completions HTTP/1.1" 200`), with the time the request took.
"""
from __future__ import annotations

import logging
import sys

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger

from engine.config import EngineConfig
from engine.core.engine_core import resolve_device
from engine.core.llm_engine import LLMEngine
from engine.entrypoints.openai_protocol import Limits
from engine.model.loader import ModelSource

LOG = logging.getLogger("engine.serve")


def setup() -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s %(asctime)s %(message)s", "%m-%d %H:%M:%S"))
    LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
    LOG.propagate = False


def _weights(source: ModelSource) -> str:
    if source.kind == "dummy" and source.path is None:
        return "random weights (a named config)"
    if source.kind == "dummy":
        return f"random weights in the shapes of {source.path} (--load-format dummy)"
    return f"{'safetensors' if source.kind == 'hf' else 'GGUF'} weights from {source.path}"


def model_line(config: EngineConfig, source: ModelSource) -> str:
    device, dtype = resolve_device(config)
    nodes = f" on {config.nnodes} nodes" if config.nnodes > 1 else ""
    return (f"model {config.model}: {_weights(source)}; {str(dtype).removeprefix('torch.')} on "
            f"{device}, tp {config.tensor_parallel_size} x pp {config.pipeline_parallel_size} "
            f"({config.world_size} worker processes{nodes})")


def engine_line(engine: LLMEngine) -> str:
    config, blocks = engine.config, engine.core.num_blocks
    return (f"KV cache: {blocks} blocks of {config.block_size} tokens ({blocks * config.block_size} "
            f"tokens); max-model-len {engine.max_model_len}, max-num-seqs {config.max_num_seqs}")


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class AccessLogger(AbstractAccessLogger):
    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        major, minor = request.version
        self.logger.info('%s "%s %s HTTP/%d.%d" %d %.3f s', request.remote, request.method,
                         request.path_qs, major, minor, response.status, time)


def limits_line(limits: Limits) -> str:
    return (f"limits: a prompt of at most {limits.max_prompt_chars} characters "
            f"(--max-prompt-chars); a connection closed after {limits.idle_timeout_s:g} s "
            f"without a whole request (--idle-timeout)")
