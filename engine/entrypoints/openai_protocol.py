"""The OpenAI API's JSON: request bodies in (checked, with OpenAI-style errors), responses out.

Only what the engine can honour is accepted: one choice per request (n=1), no
logprobs. Fields the engine has no use for (user, metadata, ...) are ignored,
as the OpenAI API ignores fields it does not know. The sampling parameters'
ranges are SamplingParams.validate's, named here by the field they came from.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from engine.sampling_params import SamplingParams, SamplingParamsError

MAX_PROMPT_CHARS = 1 << 20  # 2 to 8 times the text of a 128k-token prompt
IDLE_TIMEOUT_S = 15.0


@dataclass
class Limits:
    """What one connection and one request may take: `engine serve`'s
    --max-prompt-chars and --idle-timeout."""
    max_prompt_chars: int = MAX_PROMPT_CHARS
    idle_timeout_s: float = IDLE_TIMEOUT_S


class APIError(Exception):
    """A request the server refuses; becomes `{"error": {...}}` with an HTTP status."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def to_json(self) -> dict:
        return {"error": {"message": self.message, "type": self.type,
                          "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param)


@dataclass
class GenerateRequest:
    """One completion or chat completion request, before its prompt is tokenized."""
    model: str
    prompt: str | list[int] | None       # completions
    messages: list[dict] | None          # chat completions
    max_tokens: int | None               # None: up to the end of the context
    temperature: float
    top_p: float
    top_k: int
    seed: int | None
    stop: list[str]
    ignore_eos: bool
    stream: bool
    include_usage: bool

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        params = SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                                max_tokens=max_tokens, seed=self.seed, stop=self.stop,
                                ignore_eos=self.ignore_eos)
        try:
            params.validate()
        except SamplingParamsError as error:
            raise invalid(str(error), error.param) from None
        return params


# -- parsing ------------------------------------------------------------------

_JSON_TYPE = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
              list: "an array", dict: "an object"}


def _field(body: dict, name: str, kind: type, default=None, required: bool = False):
    """body[name] if it is of JSON type `kind` (null counts as absent), else a 400."""
    value = body.get(name)
    if value is None:
        if required:
            raise invalid(f"'{name}' is a required field", name)
        return default
    accepted = (int, float) if kind is float else kind
    if isinstance(value, bool) and kind is not bool or not isinstance(value, accepted):
        raise invalid(f"'{name}' must be {_JSON_TYPE[kind]}, got {_json_type_of(value)}", name)
    return value


def _number(body: dict, name: str, default: float) -> float:
    """body[name] as a float; an integer too large for one is a 400, not an OverflowError."""
    value = _field(body, name, float, default)
    try:
        return float(value)
    except OverflowError:
        raise invalid(f"'{name}' is out of range", name) from None


def _json_type_of(value) -> str:
    if value is None:
        return "null"
    return next((t for k, t in _JSON_TYPE.items() if type(value) is k), type(value).__name__)


def _common(body: dict, max_tokens_default: int | None) -> dict:
    if _field(body, "n", int, 1) != 1:
        raise invalid("only n=1 is supported", "n")
    if body.get("logprobs"):
        raise invalid("logprobs are not supported", "logprobs")
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid("'stop' must be a string or an array of strings", "stop")
    max_tokens = _field(body, "max_tokens", int, max_tokens_default)
    if max_tokens is not None and max_tokens < 1:
        raise invalid(f"'max_tokens' must be at least 1, got {max_tokens}", "max_tokens")
    stream_options = _field(body, "stream_options", dict, {})
    return dict(
        model=_field(body, "model", str, required=True),
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 1.0),
        top_p=_number(body, "top_p", 1.0),
        top_k=_field(body, "top_k", int, 0),
        seed=_field(body, "seed", int),
        stop=stop,
        ignore_eos=_field(body, "ignore_eos", bool, False),
        stream=_field(body, "stream", bool, False),
        include_usage=_field(stream_options, "include_usage", bool, False),
    )


def parse_completion(body) -> GenerateRequest:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    prompt = body.get("prompt")
    if prompt is None:
        raise invalid("'prompt' is a required field", "prompt")
    is_token_ids = isinstance(prompt, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not isinstance(prompt, str) and not is_token_ids:
        raise invalid("'prompt' must be a string or an array of token ids", "prompt")
    if not prompt:
        raise invalid("'prompt' must not be empty", "prompt")
    return GenerateRequest(prompt=prompt, messages=None, **_common(body, max_tokens_default=16))


def parse_chat(body) -> GenerateRequest:
    if not isinstance(body, dict):
        raise invalid("the request body must be a JSON object")
    messages = _field(body, "messages", list, required=True)
    if not messages:
        raise invalid("'messages' must not be empty", "messages")
    common = _common(body, max_tokens_default=None)
    if common["max_tokens"] is None:
        common["max_tokens"] = _field(body, "max_completion_tokens", int)
        if common["max_tokens"] is not None and common["max_tokens"] < 1:
            raise invalid(f"'max_completion_tokens' must be at least 1, got {common['max_tokens']}",
                          "max_completion_tokens")
    return GenerateRequest(prompt=None, messages=[_message(m, i) for i, m in enumerate(messages)],
                           **common)


def _message(message, index: int) -> dict:
    param = f"messages[{index}]"
    if not isinstance(message, dict):
        raise invalid(f"'{param}' must be an object", param)
    role = _field(message, "role", str, required=True)
    content = message.get("content")
    if isinstance(content, list):  # content parts: only text ones can reach a text model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise invalid(f"'{param}.content' parts must be text parts", f"{param}.content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise invalid(f"'{param}.content' must be a string or an array of text parts",
                      f"{param}.content")
    return {"role": role, "content": content}


# -- responses ------------------------------------------------------------------

def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(request_id: str, model: str, text: str | None, finish_reason: str | None,
               usage_json: dict | None = None, chunk: bool = False) -> dict:
    """A /v1/completions response, or one streamed chunk of it (same object in both cases)."""
    choices = [] if text is None else [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]
    body = {"id": request_id, "object": "text_completion", "created": int(time.time()),
            "model": model, "choices": choices}
    if usage_json is not None or not chunk:
        body["usage"] = usage_json
    return body


def chat_completion(request_id: str, model: str, text: str, finish_reason: str,
                    usage_json: dict) -> dict:
    return {"id": request_id, "object": "chat.completion", "created": int(time.time()),
            "model": model, "usage": usage_json,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": finish_reason}]}


def chat_chunk(request_id: str, model: str, delta: dict | None, finish_reason: str | None = None,
               usage_json: dict | None = None) -> dict:
    """One streamed chat chunk; delta None makes the usage-only last chunk."""
    choices = [] if delta is None else [
        {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]
    body = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
            "model": model, "choices": choices}
    if usage_json is not None:
        body["usage"] = usage_json
    return body


def model_list(model: str, max_model_len: int) -> dict:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0,
                                        "owned_by": "engine", "max_model_len": max_model_len}]}
