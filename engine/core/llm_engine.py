"""LLMEngine: tokenizer + EngineCore + each request's detokenizer, which applies stop
strings (detokenizer.py)."""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.config import EngineConfig
from engine.core.detokenizer import Detokenizer
from engine.core.engine_core import EngineCore
from engine.core.request import Request
from engine.core.scheduler import SchedulerStats
from engine.model.config import check_parallel
from engine.model.loader import resolve_model
from engine.sampling_params import SamplingParams

DEFAULT_MAX_MODEL_LEN = 4096


@dataclass
class RequestOutput:
    req_id: str
    prompt_token_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    new_token_ids: list[int] = field(default_factory=list)
    new_text: str = ""
    finished: bool = False
    finish_reason: str | None = None


@dataclass
class _Request:
    output: RequestOutput
    detokenizer: Detokenizer


class LLMEngine:
    def __init__(self, config: EngineConfig):
        config.validate()
        source = resolve_model(config.model, config.load_format)
        check_parallel(source.model_config, config.tensor_parallel_size,
                       config.pipeline_parallel_size)
        self.config = config
        self.model_config = source.model_config
        self.random_weights = source.kind == "dummy"   # its text is noise
        self.max_model_len = min(config.max_model_len or DEFAULT_MAX_MODEL_LEN,
                                 source.model_config.max_position_embeddings)
        self.tokenizer = source.tokenizer()
        self.core = EngineCore(config, source.model_config, self.max_model_len)
        self._requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    def add_request(self, prompt: str | list[int], params: SamplingParams,
                    req_id: str | None = None) -> str:
        """Queue a request; raises ValueError with a one-line message for bad input."""
        params.validate()
        token_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        vocab_size = self.model_config.vocab_size
        if not isinstance(prompt, str) and not all(0 <= t < vocab_size for t in token_ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab_size})")
        if not token_ids:
            raise ValueError("the prompt is empty")
        if len(token_ids) >= self.max_model_len:
            raise ValueError(f"the prompt has {len(token_ids)} tokens; the context holds "
                             f"{self.max_model_len} (--max-model-len)")
        req_id = req_id or f"req-{next(self._ids)}"
        self.core.add_request(Request(req_id, token_ids, params, self.tokenizer.eos_token_ids))
        output = RequestOutput(req_id, token_ids)
        detokenizer = Detokenizer(self.tokenizer.backend, params.stop, token_ids=output.token_ids)
        self._requests[req_id] = _Request(output, detokenizer)
        return req_id

    def abort_request(self, req_id: str) -> None:
        if self._requests.pop(req_id, None) is not None:
            self.core.abort_requests([req_id])

    def has_unfinished_requests(self) -> bool:
        return self.core.has_unfinished_requests()

    def stats(self) -> SchedulerStats:
        return self.core.scheduler.stats()

    def check_workers(self) -> None:
        """Raise WorkerDiedError naming the first dead worker."""
        self.core.executor.check_workers()

    def step(self) -> list[RequestOutput]:
        outputs = []
        for core_output in self.core.step():
            request = self._requests.get(core_output.req_id)
            if request is None:
                continue  # aborted while its batch was in flight
            self._update(request, core_output)
            if request.output.finished:
                del self._requests[core_output.req_id]
            outputs.append(request.output)
        return outputs

    def _update(self, request: _Request, core_output) -> None:
        out = request.output
        out.new_token_ids = list(core_output.new_token_ids)
        out.finished, out.finish_reason = core_output.finished, core_output.finish_reason
        out.new_text, stop_at = request.detokenizer.add(out.new_token_ids, out.finished)
        out.text = request.detokenizer.text
        if stop_at is not None:
            if not out.finished:
                self.core.abort_requests([out.req_id])
            out.finished, out.finish_reason = True, "stop"

    def shutdown(self) -> None:
        self.core.shutdown()
