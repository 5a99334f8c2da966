"""`python -m engine serve`: the OpenAI API over HTTP (aiohttp), in front of one LLMEngine.

One thread calls the engine (engine_loop.py). The event loop parses and
validates requests and writes responses; prompts are tokenized in a worker
thread (the tokenizer is only read, and lets go of the GIL while it works), so
that a long prompt does not stall the requests beside it. A prompt over
--max-prompt-chars is refused before it is tokenized, and a connection that
sends no whole request within --idle-timeout (after connecting, or after its
last response) is closed, as is a request whose body does not arrive within
it. A handler that ends early (its client went away) aborts its request. If a
worker dies, every request fails naming the rank, and /health says why.

stdout has one line, `serving 'NAME' on http://HOST:PORT`, once the server listens;
the log (what is served, then a line per request) goes to stderr (serve_log.py).
"""
from __future__ import annotations

import asyncio
import ctypes
import signal
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from aiohttp import web

from engine.core.llm_engine import LLMEngine
from engine.entrypoints import metrics, serve_log
from engine.entrypoints import openai_protocol as protocol
from engine.entrypoints.args import config_from_args
from engine.entrypoints.engine_loop import Delta, EngineLoop, unavailable
from engine.entrypoints.http_io import MAX_BODY_BYTES, collect, error_json, json_body, stream_events
from engine.entrypoints.openai_protocol import APIError, GenerateRequest, Limits, invalid
from engine.model.config import ModelError
from engine.model.loader import resolve_model
from engine.sampling_params import SamplingParams

TRIM_AFTER_CHARS = 1 << 16  # tokenizing a prompt this long frees megabytes the heap keeps
ALL_INTERFACES = "0.0.0.0"  # vLLM's bind address without --host
_LIBC = ctypes.CDLL(None)   # the process's own C library: with glibc, it has malloc_trim


class OpenAIServer:
    """The HTTP handlers. Everything here runs on the event loop, but tokenizing."""

    def __init__(self, engine_loop: EngineLoop, model_name: str, limits: Limits | None = None):
        self.engine_loop = engine_loop
        self.engine = engine_loop.engine     # read-only here: tokenizer and limits
        self.model_name = model_name
        self.limits = limits or Limits()
        self.metrics = metrics.ServerMetrics(model_name, lambda: engine_loop.stats)

    def app(self) -> web.Application:
        app = web.Application(middlewares=[error_json], client_max_size=MAX_BODY_BYTES)
        app.add_routes([
            web.post("/v1/completions", self.completions),
            web.post("/v1/chat/completions", self.chat_completions),
            web.get("/v1/models", self.models),
            web.get("/health", self.health),
            web.get("/metrics", self.prometheus),
        ])
        return app

    # -- small endpoints ----------------------------------------------------

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(protocol.model_list(self.model_name, self.engine.max_model_len))

    async def health(self, request: web.Request) -> web.Response:
        if self.engine_loop.error:
            raise unavailable(self.engine_loop.error)
        return web.json_response({"status": "ok"})

    async def prometheus(self, request: web.Request) -> web.Response:
        body, content_type = self.metrics.render(request.headers.get("Accept", ""))
        return web.Response(body=body, headers={"Content-Type": content_type})

    # -- generation -----------------------------------------------------------

    async def completions(self, request: web.Request) -> web.StreamResponse:
        gen = protocol.parse_completion(await self._read_body(request))
        req_id, token_ids, params = await self._prepare(gen, "cmpl")
        deltas = self._generate(req_id, token_ids, params)
        if gen.stream:
            return await self._stream_completion(request, gen, req_id, len(token_ids), deltas)
        text, num_tokens, finish_reason = await collect(deltas)
        return web.json_response(protocol.completion(
            req_id, self.model_name, text, finish_reason, protocol.usage(len(token_ids), num_tokens)))

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        gen = protocol.parse_chat(await self._read_body(request))
        req_id, token_ids, params = await self._prepare(gen, "chatcmpl")
        deltas = self._generate(req_id, token_ids, params)
        if gen.stream:
            return await self._stream_chat(request, gen, req_id, len(token_ids), deltas)
        text, num_tokens, finish_reason = await collect(deltas)
        return web.json_response(protocol.chat_completion(
            req_id, self.model_name, text, finish_reason, protocol.usage(len(token_ids), num_tokens)))

    async def _read_body(self, request: web.Request):
        """The body, read within the idle timeout: a client that trickles it holds
        no handler for long."""
        try:
            async with asyncio.timeout(self.limits.idle_timeout_s):
                return await json_body(request)
        except TimeoutError:
            raise APIError(408, f"the request body did not arrive within "
                           f"{self.limits.idle_timeout_s:g} s (--idle-timeout)",
                           code="request_timeout") from None

    async def _prepare(self, gen: GenerateRequest,
                       id_prefix: str) -> tuple[str, list[int], SamplingParams]:
        if gen.model != self.model_name:
            raise APIError(404, f"the model '{gen.model}' does not exist (this server has "
                           f"'{self.model_name}')", "model", code="model_not_found")
        token_ids = await asyncio.to_thread(self._prompt_token_ids, gen)
        max_len = self.engine.max_model_len
        if len(token_ids) >= max_len:
            raise APIError(400, f"the prompt has {len(token_ids)} tokens; this model's context "
                           f"holds {max_len}", "messages" if gen.messages else "prompt",
                           code="context_length_exceeded")
        max_tokens = gen.max_tokens or max_len - len(token_ids)
        if len(token_ids) + max_tokens > max_len:
            raise APIError(400, f"max_tokens {max_tokens} plus the prompt's {len(token_ids)} tokens "
                           f"exceed this model's context of {max_len} tokens", "max_tokens",
                           code="context_length_exceeded")
        return f"{id_prefix}-{uuid.uuid4().hex}", token_ids, gen.sampling_params(max_tokens)

    def _prompt_token_ids(self, gen: GenerateRequest) -> list[int]:
        """In a worker thread: the prompt's token ids, once it is known to be under the cap."""
        tokenizer = self.engine.tokenizer
        if gen.messages is not None:
            try:
                text = tokenizer.apply_chat_template(gen.messages)
            except ModelError as error:
                raise invalid(str(error), "messages") from None
            return self._encode(text, "messages", add_special_tokens=False)
        if isinstance(gen.prompt, str):
            return self._encode(gen.prompt, "prompt", add_special_tokens=True)
        vocab_size = self.engine.model_config.vocab_size
        if not all(0 <= t < vocab_size for t in gen.prompt):
            raise invalid(f"prompt token ids must be in [0, {vocab_size})", "prompt")
        return list(gen.prompt)

    def _encode(self, text: str, param: str, add_special_tokens: bool) -> list[int]:
        """The text's token ids if it is under the cap, else a 400 naming it."""
        limit = self.limits.max_prompt_chars
        if len(text) > limit:
            raise APIError(400, f"the prompt has {len(text)} characters; this server takes at "
                           f"most {limit} per request (--max-prompt-chars)", param,
                           code="prompt_too_long")
        token_ids = self.engine.tokenizer.encode(text, add_special_tokens=add_special_tokens)
        if len(text) >= TRIM_AFTER_CHARS:
            _give_back_freed_memory()
        return token_ids

    async def _generate(self, req_id: str, token_ids: list[int],
                        params: SamplingParams) -> AsyncIterator[Delta]:
        """The request's deltas until it finishes; leaving early aborts it."""
        sink = self.engine_loop.add(req_id, token_ids, params)
        started = last = time.monotonic()
        first, finished = True, False
        try:
            while not finished:
                item = await sink.get()
                if isinstance(item, APIError):
                    finished = True     # the engine thread has dropped it already
                    if item.status >= 500:
                        self._finished("error", started)
                    raise item
                if item.num_tokens:
                    now = time.monotonic()
                    latency = self.metrics.time_to_first_token if first else self.metrics.inter_token_latency
                    latency.observe(now - last)
                    first, last = False, now
                finished = item.finished
                if finished:
                    self._finished(item.finish_reason, started)
                yield item
        finally:
            if not finished:
                self.engine_loop.abort(req_id)
                self._finished("abort", started)

    def _finished(self, reason: str, started: float) -> None:
        self.metrics.request_success[reason].inc()
        self.metrics.e2e_request_latency.observe(time.monotonic() - started)

    async def _stream_completion(self, request: web.Request, gen: GenerateRequest, req_id: str,
                                 num_prompt_tokens: int, deltas: AsyncIterator[Delta]) -> web.StreamResponse:
        def chunk(delta: Delta) -> dict:
            return protocol.completion(req_id, self.model_name, delta.text, delta.finish_reason,
                                       chunk=True)

        def usage_chunk(num_tokens: int) -> dict:
            return protocol.completion(req_id, self.model_name, None, None,
                                       protocol.usage(num_prompt_tokens, num_tokens), chunk=True)

        return await stream_events(request, gen.include_usage, deltas, chunk, usage_chunk)

    async def _stream_chat(self, request: web.Request, gen: GenerateRequest, req_id: str,
                           num_prompt_tokens: int, deltas: AsyncIterator[Delta]) -> web.StreamResponse:
        def chunk(delta: Delta) -> dict:
            return protocol.chat_chunk(req_id, self.model_name, {"content": delta.text} if delta.text else {},
                                       delta.finish_reason)

        def usage_chunk(num_tokens: int) -> dict:
            return protocol.chat_chunk(req_id, self.model_name, None,
                                       usage_json=protocol.usage(num_prompt_tokens, num_tokens))

        role = protocol.chat_chunk(req_id, self.model_name, {"role": "assistant", "content": ""})
        return await stream_events(request, gen.include_usage, deltas, chunk, usage_chunk, first=role)


def _give_back_freed_memory() -> None:
    """glibc keeps what tokenizing a long prompt freed, in the arena of each thread
    that did it (RSS 425 -> 1190 MB over four 4 MB prompts); malloc_trim gives it
    back to the system. Without glibc, nothing."""
    trim = getattr(_LIBC, "malloc_trim", None)
    if trim is not None:
        trim(0)


# -- running the server ---------------------------------------------------------

@dataclass
class ServeOptions:
    host: str | None          # None: every interface, as vLLM
    port: int
    model_name: str           # what clients ask for
    access_log: bool
    limits: Limits


def serve(args) -> int:
    config = config_from_args(args)
    config.validate()
    serve_log.setup()
    serve_log.LOG.info(serve_log.model_line(config, resolve_model(config.model, config.load_format)))
    engine = LLMEngine(config)
    try:
        serve_log.LOG.info(serve_log.engine_line(engine))
        limits = Limits(args.max_prompt_chars, args.idle_timeout)
        serve_log.LOG.info(serve_log.limits_line(limits))
        options = ServeOptions(args.host, args.port, args.served_model_name or args.model,
                               access_log=not args.disable_uvicorn_access_log, limits=limits)
        asyncio.run(_serve_http(engine, options))
    finally:
        engine.shutdown()
    return 0


async def _serve_http(engine: LLMEngine, options: ServeOptions) -> None:
    loop = asyncio.get_running_loop()
    engine_loop = EngineLoop(engine, loop)
    access_log = {"access_log_class": serve_log.AccessLogger, "access_log": serve_log.LOG} \
        if options.access_log else {"access_log": None}
    # aiohttp's keep-alive timer runs from the connection's start and from each
    # response: a connection that sends no whole request (headers first) by then is
    # closed, idle or sending its headers a byte at a time.
    runner = web.AppRunner(OpenAIServer(engine_loop, options.model_name, options.limits).app(),
                           handler_cancellation=True,
                           keepalive_timeout=options.limits.idle_timeout_s, **access_log)
    await runner.setup()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    engine_loop.start()
    host = options.host or ALL_INTERFACES
    try:
        try:
            await web.TCPSite(runner, host, options.port).start()
        except OSError as error:
            raise ValueError(f"cannot listen on {host}:{options.port}: {error.strerror}") from None
        if options.host is None:
            serve_log.LOG.info(f"listening on every interface ({ALL_INTERFACES}, vLLM's default); "
                               "--host 127.0.0.1 keeps the server to this machine")
        bound_host, bound_port = runner.addresses[0][:2]
        print(f"serving {options.model_name!r} on {serve_log.url(bound_host, bound_port)}", flush=True)
        await stop.wait()
    finally:
        await asyncio.to_thread(engine_loop.stop)
        await runner.cleanup()
