"""The HTTP side of an OpenAI request: its body read within bounds, its errors as JSON,
its streamed answer as server-sent events.

A body is at most MAX_BODY_BYTES and must be JSON that a tokenizer can take (no NaN,
no lone surrogate); every error, aiohttp's own (404, 405) included, is OpenAI's
`{"error": {...}}`. A stream's headers go out with its first token, so that an error
before it keeps its HTTP status.
"""
from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from aiohttp import web

from engine.entrypoints.engine_loop import Delta
from engine.entrypoints.openai_protocol import APIError, invalid

MAX_BODY_BYTES = 4 << 20    # a 128k-token prompt fits, as text or as token ids


async def collect(deltas: AsyncIterator[Delta]) -> tuple[str, int, str | None]:
    text, num_tokens, finish_reason = "", 0, None
    async with aclosing(deltas):
        async for delta in deltas:
            text += delta.text
            num_tokens += delta.num_tokens
            finish_reason = delta.finish_reason
    return text, num_tokens, finish_reason


async def stream_events(request: web.Request, include_usage: bool, deltas: AsyncIterator[Delta],
               chunk: Callable[[Delta], dict], usage_chunk: Callable[[int], dict],
               first: dict | None = None) -> web.StreamResponse:
    """Stream `data: {json}` events, one per delta that has text or ends the request, then
    the usage chunk if asked for, then `data: [DONE]`. The headers go out with the first
    token, so that an error before it keeps its HTTP status; one after it becomes an
    error event."""
    async with aclosing(deltas):
        head = await anext(deltas)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                               "Cache-Control": "no-cache"})
        await response.prepare(request)
        try:
            if first is not None:
                await _send_event(response, first)
            num_tokens = await _send_delta(response, head, chunk)
            async for delta in deltas:
                num_tokens += await _send_delta(response, delta, chunk)
            if include_usage:
                await _send_event(response, usage_chunk(num_tokens))
        except APIError as error:
            await _send_event(response, error.to_json())
    await response.write(b"data: [DONE]\n\n")
    await response.write_eof()
    return response


async def _send_delta(response: web.StreamResponse, delta: Delta,
                      chunk: Callable[[Delta], dict]) -> int:
    """Send the delta if it has text or ends the request; returns its token count."""
    if delta.text or delta.finished:
        await _send_event(response, chunk(delta))
    return delta.num_tokens


async def _send_event(response: web.StreamResponse, body: dict) -> None:
    await response.write(b"data: " + json.dumps(body).encode() + b"\n\n")


async def json_body(request: web.Request):
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise APIError(413, f"the request body is over {MAX_BODY_BYTES >> 20} MiB",
                       code="request_too_large") from None
    try:
        body = json.loads(raw, parse_constant=_not_json)
        json.dumps(body, ensure_ascii=False).encode()   # no tokenizer takes a lone surrogate
    except UnicodeEncodeError:
        raise invalid("the request body has text that is not valid Unicode "
                      "(a lone surrogate such as \\ud800)") from None
    except (ValueError, RecursionError) as error:
        raise invalid(f"the request body is not valid JSON: {error}") from None
    return body


def _not_json(constant: str):
    raise ValueError(f"{constant} is not a JSON value")


@web.middleware
async def error_json(request: web.Request, handler) -> web.StreamResponse:
    """Every error as OpenAI's `{"error": {...}}`, aiohttp's own (404, 405) included."""
    try:
        return await handler(request)
    except APIError as error:
        return web.json_response(error.to_json(), status=error.status)
    except web.HTTPException as error:
        if error.status < 400:
            raise
        return web.json_response(APIError(error.status, error.reason).to_json(), status=error.status)
