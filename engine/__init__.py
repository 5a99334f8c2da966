"""A small pipeline- and tensor-parallel LLM inference engine, built like vLLM V1.

The rooms, named as vLLM names them where the concept is the same. The import
arrows go one way, down this list; no room imports one above it, and no two
modules import each other, directly or in a loop:

    entrypoints/  the front ends: `python -m engine` (cli.py), the OpenAI server, LLM
    bench/        `python -m engine bench`: throughput and latency of the offline engine
    core/         the driver: requests, the KV block manager, the scheduler, EngineCore, LLMEngine
    executor/     the driver's side of the ranks: local workers, remote nodes, collective_rpc
    worker/       one rank's process: the busy loop, the model runner, the shared-memory ring
    model/        what one rank computes: model config, Llama, its layers, attention,
                  the sampler, the weight loader and the tokenizer

The top level holds the few names every room shares, and imports no room:
config.py (EngineConfig, the flags), sampling_params.py, errors.py (EngineError),
scheduler_output.py (what the driver sends the workers each step and what comes
back) and communicator.py (every call between ranks: the probe's choke point,
which the model's parallel layers and the worker both use).

Outside the engine, only diagnose's probe API (`diagnose.probe`) and core's shared
names are imported: the phases and roles (vocab), the rank Layout, the
authenticated link (link.py, for the node link), the progress lines of a long
start-up (progress.py) and the worker's process name (proc_names.py).
"""
