"""What one rank computes, and from which weights and tokens.

config.py (ModelConfig, the named configs, the TP/PP checks), llama.py (the decoder:
one PP stage's slice of layers), its layers one concept to a module (layernorm,
rotary_embedding, activation, linear, embed_head; shard.py, kernel_flags.py), attention.py
(the paged KV cache and attention over it), sampler.py, loader.py (a model name or
path -> weights, one rank's shard of them) and tokenizer.py; device_copy.py puts
host lists on the device without waiting for the step in flight.

Rules: plain torch modules and functions, each op with a torch reference here and,
for CUDA tensors, its Triton kernel in kernels/ (imported on first use). A module
holds one TP rank's weights; every call to another rank goes through the top
level's communicator.py, never torch.distributed directly. model imports only the
top level (and kernels/, diagnose.core.progress for the loader's progress lines).
"""
