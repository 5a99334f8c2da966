"""The driver: requests, KV blocks, scheduling and the engine step, in one process.

request.py (a request's driver-side state), block_manager.py (the block pool, ref
counts, prefix caching), scheduler.py with batch_builder.py (continuous batching,
chunked prefill, preemption -> a SchedulerOutput), engine_core.py (EngineCore.step:
schedule -> execute_model -> update_from_output, with the batch queue) and
llm_engine.py (tokenizer + EngineCore + the detokenizing output processor).

Rules: no torch.distributed and no process of its own: every rank is reached
through the executor's collective_rpc. The scheduler and the block manager import
no torch at all and are tested without a model. core imports executor/ (the ranks),
model/ (the model config, the loader's resolve_model and the tokenizer) and the top
level; never entrypoints/ or bench/. It marks the driver's phases through the probe.
"""
