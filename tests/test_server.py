"""`python -m engine serve` as a real process, driven by the official openai client and by raw HTTP.

Servers are shared per module (start-up costs seconds); each one is stopped with
SIGTERM in its fixture's finalizer, which then checks that the server, its workers
and its shared memory are all gone.
"""
from __future__ import annotations

import asyncio
import json
import os
import random
import re
import signal
import subprocess
import sys
import time

import aiohttp
import openai
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.model.loader import resolve_model
from helpers.engine_server import (MAX_MODEL_LEN, SHORT, START_TIMEOUT_S, Server, http_get,
                                   start_server, stop_server)
from helpers.run import REPO

TINY_MAX_MODEL_LEN = 4000       # `--max-model-len 4k`: k is 1000 to vLLM, K 1024
# vllm/v1/metrics/buckets.py of vLLM 0.32: INTER_TOKEN_LATENCY_BUCKETS
VLLM_ITL_BUCKETS = [0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                    7.5, 10.0, 20.0, 40.0, 80.0]


def _rank_pids(server: Server) -> list[int]:
    """The workers in rank order: the executor spawns them one after another."""
    children = psutil.Process(server.proc.pid).children()
    workers = [p for p in children if "resource_tracker" not in " ".join(p.cmdline())]
    return [p.pid for p in sorted(workers, key=lambda p: (p.create_time(), p.pid))]


@pytest.fixture(scope="module")
def tiny():
    """Started with a command line as vLLM's docs write them: the model positional, a
    suffixed length, -tp, and a flag with underscores."""
    server = start_server("tiny-llama", "--max-model-len", "4k", "-tp", "2", "--pipeline_parallel_size", "2",
                    "--num-gpu-blocks-override", "1025")   # the KV cache of 64 requests of 256 tokens
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def smollm2():
    server = start_server("smollm2-135m", *SHORT)
    yield server
    stop_server(server)


def _client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _metrics(server: Server) -> dict[str, float]:
    """/metrics, read by prometheus_client's own parser, as sample name -> value; a sample
    with labels beyond model_name and engine is named `name{label=value,...}`."""
    text = http_get(server, "/metrics")[1]
    values = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            assert {sample.labels.pop("model_name"), sample.labels.pop("engine")} == {server.model, "0"}
            extra = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            values[sample.name + (f"{{{extra}}}" if extra else "")] = sample.value
    return values


def _generate_cli(model: str, prompt: str, max_tokens: int, *flags: str) -> dict:
    out = subprocess.run([sys.executable, "-m", "engine", "generate", "--model", model, "--prompt", prompt,
                          "--max-tokens", str(max_tokens), "--json", *flags],
                         cwd=REPO, capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# -- the openai client ------------------------------------------------------------

def _check_completion_and_streamed_chat(server: Server) -> None:
    client = _client(server)
    done = client.completions.create(model=server.model, prompt="The capital of France is",
                                     max_tokens=8, temperature=0)
    choice = done.choices[0]
    assert choice.finish_reason in ("stop", "length")
    assert 1 <= done.usage.completion_tokens <= 8
    assert done.usage.total_tokens == done.usage.prompt_tokens + done.usage.completion_tokens
    tokenizer = resolve_model(server.model).tokenizer()
    assert done.usage.prompt_tokens == len(tokenizer.encode("The capital of France is"))

    messages = [{"role": "user", "content": "What is 2 + 2?"}]
    whole = client.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                          temperature=0)
    chunks = list(client.chat.completions.create(model=server.model, messages=messages, max_tokens=10,
                                                temperature=0, stream=True,
                                                stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.choices[0].message.content
    assert finish == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    chat_ids = tokenizer.encode(tokenizer.apply_chat_template(messages), add_special_tokens=False)
    assert whole.usage.prompt_tokens == len(chat_ids)


def test_openai_client_tiny_llama_tp2_pp2(tiny):
    _check_completion_and_streamed_chat(tiny)


def test_openai_client_smollm2_tp1(smollm2):
    _check_completion_and_streamed_chat(smollm2)


def test_greedy_over_http_equals_generate_cli(smollm2):
    prompt = "Once upon a time, there was a"
    expected = _generate_cli("smollm2-135m", prompt, 16, "--max-model-len", str(MAX_MODEL_LEN))
    got = _client(smollm2).completions.create(model=smollm2.model, prompt=prompt, max_tokens=16,
                                               temperature=0)
    assert got.choices[0].text == expected["text"]
    assert got.usage.completion_tokens == len(expected["token_ids"])
    assert got.choices[0].finish_reason == expected["finish_reason"]


def test_greedy_tp2_pp2_over_http_equals_generate_cli(tiny):
    prompt = "hello, world"
    expected = _generate_cli("tiny-llama", prompt, 16, "-tp", "2", "-pp", "2")
    got = _client(tiny).completions.create(model=tiny.model, prompt=prompt, max_tokens=16, temperature=0)
    assert got.choices[0].text == expected["text"]
    assert got.usage.completion_tokens == len(expected["token_ids"])


# -- load ---------------------------------------------------------------------------

async def _stream(session: aiohttp.ClientSession, server: Server, prompt: str, max_tokens: int) -> dict:
    """One streamed completion, checked event by event; returns its text and usage."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    async with session.post(server.url + "/v1/completions", json=body) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        raw = (await response.read()).decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""], raw[-200:]
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: {") for e in events[:-2])
    assert len({c["id"] for c in chunks}) == 1
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    reasons = [c["choices"][0]["finish_reason"] for c in text_chunks]
    assert reasons[-1] == "length" and not any(reasons[:-1])
    assert usage_chunk["choices"] == []
    return {"text": "".join(c["choices"][0]["text"] for c in text_chunks), "usage": usage_chunk["usage"]}


async def _load(server: Server, jobs: list[tuple[str, int]], concurrency: int) -> list[dict]:
    limit = asyncio.Semaphore(concurrency)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        async def one(prompt: str, max_tokens: int) -> dict:
            async with limit:
                return await _stream(session, server, prompt, max_tokens)
        return await asyncio.gather(*(one(p, m) for p, m in jobs))


def test_load_64_concurrent_streams_256_requests(tiny):
    rng = random.Random(0)
    jobs = [(" ".join(rng.choice(["alpha", "beta", "gamma", "delta"]) for _ in range(rng.randint(1, 40))),
             rng.randint(1, 8)) for _ in range(256)]
    tokenizer = resolve_model("tiny-llama").tokenizer()
    before = _metrics(tiny)
    started = time.monotonic()
    results = asyncio.run(_load(tiny, jobs, concurrency=64))
    elapsed = time.monotonic() - started
    for (prompt, max_tokens), result in zip(jobs, results):
        assert result["usage"]["completion_tokens"] == max_tokens
        assert result["usage"]["prompt_tokens"] == len(tokenizer.encode(prompt))
    after = _metrics(tiny)
    assert after["vllm:num_requests_running"] == 0
    assert after["vllm:num_requests_waiting"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated == sum(m for _, m in jobs)
    ttft = after["vllm:time_to_first_token_seconds_count"] - before["vllm:time_to_first_token_seconds_count"]
    assert ttft == len(jobs)
    print(f"\n256 streamed requests, 64 concurrent: {len(jobs) / elapsed:.1f} req/s, "
          f"{generated / elapsed:.1f} output tok/s")


def test_disconnected_streams_free_their_kv_blocks(tiny):
    num_clients = 20
    all_streaming = asyncio.Event()
    streaming = 0

    async def read_then_hang_up(session: aiohttp.ClientSession) -> None:
        nonlocal streaming
        body = {"model": tiny.model, "prompt": "a long story: ", "max_tokens": 200, "ignore_eos": True,
                "stream": True}
        async with session.post(tiny.url + "/v1/completions", json=body) as response:
            await response.content.readuntil(b"\n\n")
            streaming += 1
            if streaming == num_clients:
                all_streaming.set()
            await all_streaming.wait()
        # leaving the block drops the connection mid-stream

    async def run() -> dict[str, float]:
        async with aiohttp.ClientSession() as session:
            clients = [asyncio.create_task(read_then_hang_up(session)) for _ in range(num_clients)]
            await all_streaming.wait()
            during = await asyncio.to_thread(_metrics, tiny)
            await asyncio.gather(*clients)
        return during

    before = _metrics(tiny)
    during = asyncio.run(run())
    hung_up = time.monotonic()
    assert 0 < during["vllm:kv_cache_usage_perc"] <= 1
    assert during["vllm:num_requests_running"] + during["vllm:num_requests_waiting"] == num_clients
    while (after := _metrics(tiny))["vllm:kv_cache_usage_perc"] and time.monotonic() - hung_up < 10:
        time.sleep(0.1)
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert after["vllm:num_requests_running"] == after["vllm:num_requests_waiting"] == 0
    generated = after["vllm:generation_tokens_total"] - before["vllm:generation_tokens_total"]
    assert generated < num_clients * 200 / 2    # they were stopped, not run to the end
    aborted = "vllm:request_success_total{finished_reason=abort}"
    assert after[aborted] - before[aborted] == num_clients
    assert _client(tiny).completions.create(model=tiny.model, prompt="still here?", max_tokens=2).usage


# -- /metrics and the log --------------------------------------------------------------

def test_metrics_parse_with_prometheus_client_and_carry_vllm_names(tiny):
    before = _metrics(tiny)
    done = _client(tiny).completions.create(model=tiny.model, prompt="count me", max_tokens=5,
                                            extra_body={"ignore_eos": True})
    after = _metrics(tiny)

    def grew(name: str) -> float:
        return after[name] - before[name]

    assert grew("vllm:prompt_tokens_total") == done.usage.prompt_tokens
    assert grew("vllm:generation_tokens_total") == 5
    assert grew("vllm:request_success_total{finished_reason=length}") == 1
    assert grew("vllm:request_success_total{finished_reason=stop}") == 0
    for name, count in [("vllm:time_to_first_token_seconds", 1), ("vllm:inter_token_latency_seconds", 4),
                        ("vllm:e2e_request_latency_seconds", 1)]:
        assert grew(f"{name}_count") == count and grew(f"{name}_sum") > 0, name
    itl_bounds = sorted(float(name.partition("le=")[2].rstrip("}")) for name in after
                        if name.startswith("vllm:inter_token_latency_seconds_bucket"))
    assert itl_bounds == [*VLLM_ITL_BUCKETS, float("inf")]
    assert after["vllm:kv_cache_usage_perc"] == after["vllm:num_requests_running"] == 0
    assert after["vllm:prefix_cache_queries_total"] >= after["vllm:prefix_cache_hits_total"]
    kinds = {f.name: f.type for f in text_string_to_metric_families(http_get(tiny, "/metrics")[1])}
    assert kinds.items() >= {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:num_preemptions": "counter",
        "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter", "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram", "vllm:e2e_request_latency_seconds": "histogram",
    }.items()


def test_metrics_speak_openmetrics_when_asked(tiny):
    async def get(accept: str) -> tuple[str, str]:
        async with aiohttp.ClientSession() as session, session.get(
                tiny.url + "/metrics", headers={"Accept": accept}) as r:
            return r.headers["Content-Type"], await r.text()
    plain_type, _ = asyncio.run(get("*/*"))
    open_type, text = asyncio.run(get("application/openmetrics-text; version=1.0.0"))
    assert plain_type.startswith("text/plain; version=0.0.4")
    assert open_type.startswith("application/openmetrics-text") and text.endswith("# EOF\n")


def test_the_log_says_what_is_served_where_and_each_request(tiny):
    assert tiny.url.startswith("http://127.0.0.1:")
    http_get(tiny, "/v1/models?x=1")
    access = re.compile(r'INFO \d\d-\d\d \d\d:\d\d:\d\d 127\.0\.0\.1 "GET /v1/models\?x=1 HTTP/1\.1" 200 '
                        r"\d+\.\d{3} s")
    lines = tiny.log_lines_once(access)
    said = [i for i, line in enumerate(lines) if line.startswith("INFO ")]
    assert lines[said[0]].endswith(" model tiny-llama: random weights (a named config); float32 on "
                                   "cpu, tp 2 x pp 2 (4 worker processes)")
    loading = [i for i, line in enumerate(lines) if "loading weights" in line]
    assert len(loading) == 1 and loading[0] > said[0], lines    # one rank reports, in one line
    assert re.fullmatch(r"\[rank 0\] loading weights \(random weights\): \d+ tensors in \d+\.\d s",
                        lines[loading[0]])
    assert any(line.endswith(" KV cache: 1025 blocks of 16 tokens (16400 tokens); max-model-len "
                             "4000, max-num-seqs 64") for line in lines)
    assert not any("every interface" in line for line in lines)
    assert any(access.fullmatch(line) for line in lines), lines[-5:]


# -- bad requests ---------------------------------------------------------------------

LONG_PROMPT = "x" * (TINY_MAX_MODEL_LEN + 10)
BAD_REQUESTS = [
    # (path, body, status, param)
    ("/v1/completions", b'{"model": "tiny-llama", "prompt": ', 400, None),
    ("/v1/completions", b"[1, 2]", 400, None),
    ("/v1/completions", {"prompt": "hi"}, 400, "model"),
    ("/v1/completions", {"model": "tiny-llama"}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "tiny-llama"}, 400, "messages"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": 5}, 400, "prompt"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": "10"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": [1, 10**9]}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "tiny-llama", "messages": "hi"}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": 5}]},
     400, "messages[0].content"),
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}, 404, "model"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": LONG_PROMPT}, 400, "prompt"),
    ("/v1/chat/completions", {"model": "tiny-llama", "messages": [{"role": "user", "content": LONG_PROMPT}]},
     400, "messages"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": -3}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "max_tokens": TINY_MAX_MODEL_LEN}, 400,
     "max_tokens"),
    ("/v1/completions", {"model": "tiny-llama", "prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("/v1/nothing-here", {}, 404, None),
]


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(tiny):
    async def post_all() -> list[tuple[int, dict]]:
        async with aiohttp.ClientSession() as session:
            results = []
            for path, body, _, _ in BAD_REQUESTS:
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                async with session.post(tiny.url + path, data=data,
                                        headers={"Content-Type": "application/json"}) as r:
                    results.append((r.status, await r.json()))
            return results

    for (path, body, status, param), (got_status, got) in zip(BAD_REQUESTS, asyncio.run(post_all())):
        assert (got_status, got["error"]["param"]) == (status, param), (path, body, got)
        assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["message"]
    with pytest.raises(openai.NotFoundError, match="gpt-4"):
        _client(tiny).completions.create(model="gpt-4", prompt="hi")
    assert http_get(tiny, "/health")[0] == 200
    assert _client(tiny).completions.create(model=tiny.model, prompt="fine", max_tokens=3).usage.completion_tokens


# -- requests that used to break the server: each one fails alone ------------------------

def _completion(**fields) -> dict:
    return {"model": "tiny-llama", "prompt": "hi", "max_tokens": 2, **fields}


def _raw(fields: bytes) -> bytes:
    """A body json.dumps would not write: NaN, Infinity, lone surrogates, bad UTF-8."""
    return b'{"model": "tiny-llama", "max_tokens": 2, ' + fields + b"}"


CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
CHAT_HI = {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
HOSTILE_REQUESTS = {
    # id: (path, body, status, param)
    "top_k 2**70": (CMPL, _completion(top_k=2**70), 400, "top_k"),
    "chat top_k 2**70": (CHAT, dict(CHAT_HI, top_k=2**70), 400, "top_k"),
    "top_k 2**31": (CMPL, _completion(top_k=2**31), 400, "top_k"),
    "top_k -2": (CMPL, _completion(top_k=-2), 400, "top_k"),
    "temperature NaN": (CMPL, _raw(b'"prompt": "hi", "temperature": NaN'), 400, None),
    "temperature Infinity": (CMPL, _raw(b'"prompt": "hi", "temperature": Infinity'), 400, None),
    "temperature 1e999": (CMPL, _raw(b'"prompt": "hi", "temperature": 1e999'), 400, "temperature"),
    "temperature 10**400": (CMPL, _completion(temperature=10**400), 400, "temperature"),
    "temperature 2.5": (CMPL, _completion(temperature=2.5), 400, "temperature"),
    "top_p 0": (CMPL, _completion(top_p=0), 400, "top_p"),
    "top_p 1.5": (CMPL, _completion(top_p=1.5), 400, "top_p"),
    "seed 2**64": (CMPL, _completion(seed=2**64), 400, "seed"),
    "seed -2**63-1": (CMPL, _completion(seed=-2**63 - 1), 400, "seed"),
    "max_tokens 10**30": (CMPL, _completion(max_tokens=10**30), 400, "max_tokens"),
    "17 stop strings": (CMPL, _completion(stop=[f"s{i}" for i in range(17)]), 400, "stop"),
    "a stop string of 257": (CMPL, _completion(stop="x" * 257), 400, "stop"),
    "token id 2**70": (CMPL, _completion(prompt=[1, 2**70]), 400, "prompt"),
    "token id -1": (CMPL, _completion(prompt=[-1]), 400, "prompt"),
    "lone surrogate": (CMPL, _raw(rb'"prompt": "a\ud800"'), 400, None),
    "chat lone surrogate": (CHAT, _raw(rb'"messages": [{"role": "user", "content": "\udfff"}]'),
                            400, None),
    "not UTF-8": (CMPL, _raw(b'"prompt": "\xff"'), 400, None),
    "nested 100k deep": (CMPL, b"[" * 100_000 + b"]" * 100_000, 400, None),
    "over 4 MiB": (CMPL, _completion(prompt="x" * (4 << 20)), 413, None),
}


@pytest.mark.parametrize("name", HOSTILE_REQUESTS)
def test_a_hostile_request_fails_alone_and_the_next_one_is_served(tiny, name):
    path, body, status, param = HOSTILE_REQUESTS[name]

    async def post() -> tuple[int, dict]:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        async with aiohttp.ClientSession() as session, session.post(
                tiny.url + path, data=data, headers={"Content-Type": "application/json"}) as r:
            return r.status, await r.json()

    got_status, got = asyncio.run(post())
    assert (got_status, got["error"]["param"]) == (status, param), got
    assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["message"]
    assert _client(tiny).completions.create(model=tiny.model, prompt="next", max_tokens=2).usage
    assert http_get(tiny, "/health") == (200, '{"status": "ok"}')


def test_a_tiny_temperature_samples_greedily(tiny):
    client = _client(tiny)
    greedy, tiny_t = (client.completions.create(model=tiny.model, prompt="hello", max_tokens=8,
                                                 temperature=t, extra_body={"ignore_eos": True})
                      for t in (0, 1e-300))
    assert tiny_t.choices[0].text == greedy.choices[0].text


def test_models_and_health(tiny):
    assert [m.id for m in _client(tiny).models.list()] == ["tiny-llama"]
    assert json.loads(http_get(tiny, "/v1/models")[1])["data"][0]["max_model_len"] == TINY_MAX_MODEL_LEN
    assert http_get(tiny, "/health") == (200, '{"status": "ok"}')


# -- shutdown and a worker that dies -------------------------------------------------------

@pytest.fixture
def fresh_server():
    """Start a server of the test's own; stopped (and checked) at the end if the test did not."""
    servers = []

    def start(model: str, *flags: str, host: str | None = "127.0.0.1") -> Server:
        servers.append(start_server(model, *SHORT, *flags, host=host))
        return servers[-1]
    yield start
    for server in servers:
        if server.proc.poll() is None:
            stop_server(server)


def test_sigint_ends_running_requests_and_leaves_nothing_behind(fresh_server):
    server = fresh_server("tiny-llama", "-pp", "2", host=None)
    port = server.url.rpartition(":")[2]
    assert server.url == f"http://0.0.0.0:{port}"     # vLLM's default: every interface
    assert "listening on every interface (0.0.0.0" in server.stderr()
    stream = _client(server).completions.create(model=server.model, prompt="x", max_tokens=MAX_MODEL_LEN - 4,
                                                stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    stop_server(server, signal.SIGINT)
    with pytest.raises(openai.APIError, match="shutting down"):
        for _ in stream:
            pass


def test_killed_worker_fails_health_and_requests_naming_the_rank(fresh_server):
    server = fresh_server("tiny-llama", "-tp", "2")
    client = _client(server)
    stream = client.completions.create(model=server.model, prompt="x", max_tokens=MAX_MODEL_LEN - 4,
                                       stream=True, extra_body={"ignore_eos": True})
    next(iter(stream))
    os.kill(_rank_pids(server)[1], signal.SIGKILL)
    killed = time.monotonic()
    with pytest.raises(openai.APIError, match="rank 1"):
        for _ in stream:
            pass
    status, body = http_get(server, "/health")
    assert status == 503 and "rank 1" in body
    assert time.monotonic() - killed < 5
    for stream in (False, True):
        with pytest.raises(openai.APIStatusError, match="rank 1") as error:
            client.completions.create(model=server.model, prompt="x", max_tokens=2, stream=stream)
        assert error.value.status_code == 503
