"""The engine's front ends: where a command line or an HTTP request becomes engine calls.

cli.py is `python -m engine {generate,serve,bench}`: every flag is checked (args.py,
with vLLM's spellings from vllm_flags.py) before torch is imported, and a bad one is
one line and exit 2. llm.py is the offline front end (LLM.generate), server.py the
OpenAI-compatible HTTP server, with its protocol (openai_protocol.py), its one engine
thread (engine_loop.py), its log (serve_log.py) and its /metrics (metrics.py).

Rules: this room may import every other room; none imports it. It is the only room
that knows HTTP, the OpenAI API or the command line; what the rooms below report is
an exception (EngineError, ModelError, ValueError) that cli.py turns into one line.
"""
