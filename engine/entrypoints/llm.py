"""LLM(...).generate(prompts, SamplingParams): the offline front end."""
from __future__ import annotations

from engine.config import EngineConfig
from engine.core.llm_engine import LLMEngine, RequestOutput
from engine.sampling_params import SamplingParams


class LLM:
    def __init__(self, model: str = "tiny-llama", **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **kwargs))

    def generate(self, prompts: list[str | list[int]],
                 params: SamplingParams | None = None) -> list[RequestOutput]:
        params = params or SamplingParams()
        ids = [self.engine.add_request(p, params) for p in prompts]
        done: dict[str, RequestOutput] = {}
        while self.engine.has_unfinished_requests():
            done.update((o.req_id, o) for o in self.engine.step() if o.finished)
        return [done[i] for i in ids]

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
