"""LLMEngine: tokenizer + EngineCore + the detokenizer that applies stop strings.

Detokenizing is incremental, as in vLLM: each step decodes a window of the
last few tokens, from the start of the last text it released, so a step costs
the same however long the output grew. Text is released up to the last
complete character, and the stop strings are looked for in the new text only.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from engine.config import EngineConfig
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
class _Detokenizer:
    output: RequestOutput
    params: SamplingParams
    sent_chars: int = 0
    prefix_offset: int = 0       # the decoded window starts at this token...
    read_offset: int = 0         # ...and its text up to this one is in output.text


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
        self._detok: dict[str, _Detokenizer] = {}
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
        self._detok[req_id] = _Detokenizer(RequestOutput(req_id, token_ids), params)
        return req_id

    def abort_request(self, req_id: str) -> None:
        if self._detok.pop(req_id, None) is not None:
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
            state = self._detok.get(core_output.req_id)
            if state is None:
                continue  # aborted while its batch was in flight
            self._update(state, core_output)
            if state.output.finished:
                del self._detok[core_output.req_id]
            outputs.append(state.output)
        return outputs

    def _update(self, state: _Detokenizer, core_output) -> None:
        out = state.output
        out.new_token_ids = list(core_output.new_token_ids)
        out.token_ids.extend(out.new_token_ids)
        out.finished, out.finish_reason = core_output.finished, core_output.finish_reason
        searched = max(len(out.text) - max((len(s) - 1 for s in state.params.stop), default=0), 0)
        out.text += self._new_text(state)
        stop_at = _first_stop(out.text, state.params.stop, searched)
        if stop_at is not None:
            out.text = out.text[:stop_at]
            if not out.finished:
                self.core.abort_requests([out.req_id])
            out.finished, out.finish_reason = True, "stop"
        ready = len(out.text) if out.finished else _releasable(out.text, state.params.stop)
        out.new_text = out.text[state.sent_chars:ready]
        state.sent_chars = max(state.sent_chars, ready)

    def _new_text(self, state: _Detokenizer) -> str:
        """The text the new tokens add: the window decoded, less the text of its part
        already read. Held back while it ends in an unfinished character, unless the
        request has finished."""
        ids = state.output.token_ids
        known = self.tokenizer.decode(ids[state.prefix_offset:state.read_offset])
        window = self.tokenizer.decode(ids[state.prefix_offset:])
        if len(window) <= len(known) or (window.endswith("\ufffd") and not state.output.finished):
            return ""
        state.prefix_offset, state.read_offset = state.read_offset, len(ids)
        return window[len(known):]

    def shutdown(self) -> None:
        self.core.shutdown()


def _releasable(text: str, stops: list[str]) -> int:
    """How much of unfinished text may be streamed: hold back a possible start of a
    stop string."""
    return max(len(text) - max((len(s) - 1 for s in stops), default=0), 0)


def _first_stop(text: str, stops: list[str], start: int) -> int | None:
    """Where the first stop string in text[start:] begins."""
    hits = [i for i in (text.find(s, start) for s in stops if s) if i >= 0]
    return min(hits) if hits else None
