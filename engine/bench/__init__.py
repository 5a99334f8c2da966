"""`python -m engine bench`: offline throughput, TTFT and ITL percentiles, --sweep over a flag.

Rules: the bench drives core's LLMEngine as the offline front end does and takes its
EngineConfig from the caller (entrypoints/cli.py parses the flags); it imports core
and the top level, never entrypoints. Its JSON layout (`schema_version`) is public:
docs and benchmark scripts read it.
"""
