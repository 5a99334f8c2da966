"""`python -m engine serve` under requests built to hurt it, over real HTTP and
raw sockets: a prompt of megabytes is tokenized off the event loop (the request
beside it is answered first) or refused by --max-prompt-chars before it is
tokenized; a connection that sends nothing, or its headers a byte at a time, is
closed after --idle-timeout, and a body that trickles is answered 408."""
from __future__ import annotations

import asyncio
import json
import socket
import time
from urllib.parse import urlsplit

import aiohttp
import pytest

from helpers.engine_server import SHORT, http_get, start_server, stop_server

pytestmark = pytest.mark.e2e

CAP = 2 << 20                   # --max-prompt-chars 2M
IDLE_S = 2.0                    # --idle-timeout 2
CLOSE_SLACK_S = 5.0             # a loaded machine's delay past the timeout
SENTENCE = "The quick brown fox jumps over the lazy dog. "


@pytest.fixture(scope="module")
def server():
    started = start_server("smollm2-135m", *SHORT, "--max-prompt-chars", "2M",
                     "--idle-timeout", str(IDLE_S))
    yield started
    stop_server(started)


def text_of(chars: int) -> str:
    return (SENTENCE * (chars // len(SENTENCE) + 1))[:chars]


async def post(session, url: str, path: str, body: dict) -> tuple[int, dict, float]:
    async with session.post(url + path, json=body) as response:
        return response.status, await response.json(), time.monotonic()


def completion(server, prompt: str) -> dict:
    return {"model": server.model, "prompt": prompt, "max_tokens": 1, "temperature": 0}


def test_a_long_prompt_is_tokenized_off_the_loop_and_the_request_beside_it_goes_first(server):
    async def race():
        timeout = aiohttp.ClientTimeout(total=300)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            big = asyncio.create_task(post(session, server.url, "/v1/completions",
                                           completion(server, text_of(CAP - 1000))))
            await asyncio.sleep(0.5)       # its body is in; it is being tokenized
            small = await post(session, server.url, "/v1/completions",
                               completion(server, "Hello"))
            return small, await big
    (small_status, _, small_done), (big_status, big_body, big_done) = asyncio.run(race())
    assert small_status == 200
    assert big_status == 400 and big_body["error"]["code"] == "context_length_exceeded"
    assert small_done < big_done       # the loop answered it while the big one was tokenized


@pytest.mark.parametrize("path, field", [("/v1/completions", "prompt"),
                                         ("/v1/chat/completions", "messages")])
def test_a_prompt_over_the_cap_is_a_400_that_names_the_limit(server, path, field):
    text = text_of(CAP + 1)
    body = (completion(server, text) if field == "prompt" else
            {"model": server.model, "max_tokens": 1,
             "messages": [{"role": "user", "content": text}]})

    async def send():
        async with aiohttp.ClientSession() as session:
            started = time.monotonic()
            status, answer, done = await post(session, server.url, path, body)
            return status, answer, done - started
    status, answer, took_s = asyncio.run(send())
    assert status == 400, answer
    error = answer["error"]
    assert (error["code"], error["param"]) == ("prompt_too_long", field)
    assert f"at most {CAP} per request (--max-prompt-chars)" in error["message"]
    assert http_get(server, "/health")[0] == 200


def _raw(server) -> socket.socket:
    parts = urlsplit(server.url)
    return socket.create_connection((parts.hostname, parts.port), timeout=IDLE_S + CLOSE_SLACK_S)


def _closed_after(sock: socket.socket, trickle: bytes = b"") -> float:
    """Seconds until the server closes `sock`, sending `trickle` a byte at a time."""
    started = time.monotonic()
    sock.settimeout(0.25)
    for byte in trickle:
        try:
            sock.send(bytes([byte]))
            if sock.recv(4096) == b"":
                return time.monotonic() - started
        except socket.timeout:
            continue
        except (BrokenPipeError, ConnectionResetError):
            return time.monotonic() - started
    sock.settimeout(IDLE_S + CLOSE_SLACK_S)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - started


@pytest.mark.parametrize("trickle", [b"", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" * 4],
                         ids=["silent", "headers-a-byte-at-a-time"])
def test_a_connection_without_a_whole_request_is_closed_after_the_idle_timeout(server, trickle):
    with _raw(server) as sock:
        took_s = _closed_after(sock, trickle)
    assert IDLE_S - 0.5 <= took_s <= IDLE_S + CLOSE_SLACK_S
    assert http_get(server, "/health")[0] == 200


def test_a_body_that_trickles_is_answered_408(server):
    body = json.dumps(completion(server, "Hello")).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    with _raw(server) as sock:
        sock.sendall(head + body[:10])
        started, answer = time.monotonic(), b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    took_s = time.monotonic() - started
    status_line, _, rest = answer.partition(b"\r\n")
    assert status_line.startswith(b"HTTP/1.1 408"), answer
    error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
    assert error["code"] == "request_timeout" and "--idle-timeout" in error["message"]
    assert IDLE_S - 0.5 <= took_s <= IDLE_S + CLOSE_SLACK_S


def test_the_log_states_the_limits(server):
    assert (f"limits: a prompt of at most {CAP} characters (--max-prompt-chars); a connection "
            f"closed after {IDLE_S:g} s without a whole request (--idle-timeout)") \
        in server.log_text()
