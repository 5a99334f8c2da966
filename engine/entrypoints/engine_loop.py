"""The engine thread of `python -m engine serve`: the one thread that calls the LLMEngine.

The LLMEngine is not thread-safe, so one thread (EngineLoop) makes every call
into it: it takes new requests and aborts from a queue, runs engine steps while
any request is unfinished (continuous batching: all requests share each step),
and hands each step's text deltas back to the event loop, one asyncio queue per
request.

If a worker dies, the engine thread records the error (naming the rank), fails
every request, shuts the engine down and refuses new requests.
"""
from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass

from engine.core.llm_engine import LLMEngine, RequestOutput
from engine.entrypoints.openai_protocol import APIError, invalid
from engine.executor.executor import WorkerDiedError
from engine.sampling_params import SamplingParams

IDLE_WORKER_CHECK_S = 0.5
SHUTTING_DOWN = "the server is shutting down"


@dataclass
class Delta:
    """What one engine step produced for one request, copied off the engine thread."""
    text: str
    num_tokens: int
    finished: bool
    finish_reason: str | None


@dataclass
class _Add:
    req_id: str
    token_ids: list[int]
    params: SamplingParams
    sink: asyncio.Queue


@dataclass
class _Abort:
    req_id: str


class EngineLoop:
    """Runs the LLMEngine on its own thread; the methods without _ are for the event loop."""

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop):
        self.engine = engine
        self.loop = loop
        self.inbox: queue.SimpleQueue[_Add | _Abort | None] = queue.SimpleQueue()
        self.sinks: dict[str, asyncio.Queue] = {}      # engine thread only
        self.stats = engine.stats()     # replaced by the engine thread
        self.error: str | None = None                  # why no request can be served any more
        self.thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def add(self, req_id: str, token_ids: list[int], params: SamplingParams) -> asyncio.Queue:
        """Queue a request; its deltas (and at most one APIError) arrive on the returned queue."""
        if self.error:
            raise unavailable(self.error)
        sink: asyncio.Queue = asyncio.Queue()
        self.inbox.put(_Add(req_id, token_ids, params, sink))
        return sink

    def abort(self, req_id: str) -> None:
        self.inbox.put(_Abort(req_id))

    def stop(self) -> None:
        """End every request, shut the engine down and wait for the thread (blocks)."""
        self.error = self.error or SHUTTING_DOWN
        self.inbox.put(None)
        self.thread.join()

    # -- the engine thread ------------------------------------------------

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as error:  # a dead worker, or a bug: fail every request, hang none
            self.error = str(error) if isinstance(error, WorkerDiedError) else \
                f"the engine failed: {error!r}"
            self._fail_all()
            self.engine.shutdown()
            self._refuse_until_stopped()
        else:
            self._fail_all()
            self.engine.shutdown()

    def _serve(self) -> None:
        while True:
            for command in self._commands(block=not self.engine.has_unfinished_requests()):
                if command is None:
                    return
                self._apply(command)
            self.stats = self.engine.stats()      # aborts free blocks too
            if self.engine.has_unfinished_requests():
                outputs = self.engine.step()
                # Before the outputs: a client that saw its request end sees it gone here.
                self.stats = self.engine.stats()
                self._deliver([(self.sinks[o.req_id], _delta(o)) for o in outputs
                               if o.req_id in self.sinks])
                for output in outputs:
                    if output.finished:
                        self.sinks.pop(output.req_id, None)

    def _commands(self, block: bool) -> list:
        """The queued commands; when idle, wait for one, checking the workers meanwhile."""
        commands = []
        if block:
            try:
                commands.append(self.inbox.get(timeout=IDLE_WORKER_CHECK_S))
            except queue.Empty:
                self.engine.check_workers()
        while not self.inbox.empty():
            commands.append(self.inbox.get())
        return commands

    def _apply(self, command: _Add | _Abort) -> None:
        if isinstance(command, _Abort):
            if self.sinks.pop(command.req_id, None) is not None:
                self.engine.abort_request(command.req_id)
            return
        try:
            self.engine.add_request(command.token_ids, command.params, command.req_id)
        except ValueError as error:
            self._deliver([(command.sink, invalid(str(error)))])
            return
        self.sinks[command.req_id] = command.sink

    def _fail_all(self) -> None:
        self._deliver([(sink, unavailable(self.error)) for sink in self.sinks.values()])
        self.sinks.clear()

    def _refuse_until_stopped(self) -> None:
        while (command := self.inbox.get()) is not None:
            if isinstance(command, _Add):
                self._deliver([(command.sink, unavailable(self.error))])

    def _deliver(self, items: list[tuple[asyncio.Queue, Delta | APIError]]) -> None:
        if items:
            self.loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[asyncio.Queue, Delta | APIError]]) -> None:
    for sink, item in items:
        sink.put_nowait(item)


def _delta(output: RequestOutput) -> Delta:
    return Delta(output.new_text, len(output.new_token_ids), output.finished, output.finish_reason)


def unavailable(reason: str) -> APIError:
    return APIError(503, reason, type="server_error", code="engine_unavailable")
