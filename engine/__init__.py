"""A small pipeline- and tensor-parallel LLM inference engine, built like vLLM V1."""
