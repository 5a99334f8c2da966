"""Triton kernels for the engine, GPU progress markers and fault kernels."""
