"""The engine's GPU path: each op reaches its Triton kernel, the model on CUDA matches
the torch reference on CPU, decode batches replay CUDA graphs with the same tokens as
eager steps, and tp=2 / pp=2 over NCCL give the tokens of one GPU."""
from __future__ import annotations

import importlib
import json

import pytest
import torch

from engine.communicator import Communicator, Layout
from engine.config import EngineConfig
from engine.entrypoints.llm import LLM
from engine.model import activation, attention, embed_head, kernel_flags, layernorm, rotary_embedding
from engine.model.config import LLAMA3_ROPE, ModelConfig
from engine.model.llama import LlamaForCausalLM
from engine.model.loader import ModelSource, load_weights, resolve_model
from engine.model.tokenizer import Tokenizer
from engine.sampling_params import SamplingParams
from engine.scheduler_output import NewRequest, RequestSampling, SchedulerOutput
from engine.worker.cuda_graphs import DecodeGraphs
from engine.worker.model_runner import ModelRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA GPU: the Triton kernels, CUDA graphs and NCCL run only there")

PROMPTS = ["Hello, my name is", "The capital of France is a city that", "1 2 3", "A long prompt " * 12]
GREEDY = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.cpu().float() - ref.float()).abs().max() / ref.float().abs().max())


# -- ops ------------------------------------------------------------------------------

def test_each_op_dispatches_to_its_kernel_on_cuda(monkeypatch):
    """The engine's op functions call the kernels for CUDA tensors and agree with their
    own torch path on CPU copies."""
    calls = []
    for module_name, name in [("kernels.norm", "rms_norm"), ("kernels.activation", "silu_and_mul"),
                              ("kernels.rotary", "apply_rotary"), ("kernels.kv_cache", "write_kv"),
                              ("kernels.attention", "paged_attention"), ("kernels.norm", "embed"),
                              ("kernels.rotary", "rotary_write_kv")]:
        module = importlib.import_module(module_name)
        kernel = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _k=kernel, _n=name: calls.append(_n) or _k(*a))

    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(7, 256, generator=gen), torch.randn(7, 256, generator=gen)
    weight = torch.randn(256, generator=gen)
    (out, new_residual), (ref, ref_residual) = (layernorm.rms_norm(t(x), t(weight), 1e-5, t(residual))
                                                for t in (torch.Tensor.cuda, torch.Tensor.cpu))
    assert relative_error(out, ref) < 1e-5 and relative_error(new_residual, ref_residual) < 1e-5
    assert relative_error(activation.silu_and_mul(x.cuda()), activation.silu_and_mul(x)) < 1e-5

    q, k = torch.randn(7, 8, 32, generator=gen), torch.randn(7, 2, 32, generator=gen)
    positions = torch.randint(0, 100, (7,), generator=gen)
    cache = rotary_embedding.rope_cos_sin_cache(32, 100, 10000.0, None)
    for out, ref in zip(rotary_embedding.apply_rotary(q.cuda(), k.cuda(), positions.cuda(), cache.cuda()),
                        rotary_embedding.apply_rotary(q, k, positions, cache)):
        assert relative_error(out, ref) < 1e-5

    # Request 0: a 3-token prompt in block 0; request 1: 4 new tokens after 3 cached ones, block 1.
    meta = attention.AttentionMetadata(
        slot_mapping=torch.tensor([0, 1, 2, 11, 12, 13, 14]),
        query_start_loc=torch.tensor([0, 3, 7], dtype=torch.int32),
        seq_lens=torch.tensor([3, 7], dtype=torch.int32),
        block_tables=torch.tensor([[0], [1]], dtype=torch.int32), max_query_len=4, max_seq_len=7)
    caches = [torch.randn(2, 8, 2, 32, generator=gen) for _ in range(2)]
    outputs = []
    for device in ("cuda", "cpu"):
        device_meta = attention.AttentionMetadata(
            *(getattr(meta, f).to(device) for f in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables")),
            meta.max_query_len, meta.max_seq_len)
        k_cache, v_cache = (c.clone().to(device) for c in caches)
        attention.write_kv(k.to(device), k.to(device), k_cache, v_cache, device_meta.slot_mapping)
        outputs.append(attention.paged_attention(q.to(device), k_cache, v_cache, device_meta, 32 ** -0.5))
    assert relative_error(*outputs) < 1e-5

    ids = torch.tensor([0, 5, 99, 3])
    (out, rows), (ref, ref_rows) = (embed_head.embed(t(ids), t(x[:, :32]), 2, t(weight[:32]), 1e-5)
                                    for t in (torch.Tensor.cuda, torch.Tensor.cpu))
    assert relative_error(out, ref) < 1e-5 and torch.equal(rows.cpu(), ref_rows)
    outputs = []
    for device in ("cuda", "cpu"):
        k_cache, v_cache = (c.clone().to(device) for c in caches)
        q_out = attention.rotary_write_kv(q.to(device), k.to(device), k.to(device), positions.to(device),
                                          cache.to(device), k_cache, v_cache, meta.slot_mapping.to(device))
        outputs.append(torch.cat([q_out.flatten(), k_cache.flatten(), v_cache.flatten()]))
    assert relative_error(*outputs) < 1e-5
    assert sorted(calls) == sorted(["rms_norm", "silu_and_mul", "apply_rotary", "write_kv", "paged_attention",
                                    "embed", "rotary_write_kv"])


# -- the model --------------------------------------------------------------------------

def two_layer_config(hidden: int, head_dim: int) -> ModelConfig:
    """Llama 3's shapes (32 heads, 8 KV heads) with two layers and a small vocabulary."""
    return ModelConfig(name=f"two-layer-{hidden}", vocab_size=1000, hidden_size=hidden,
                       intermediate_size=4 * hidden, num_layers=2, num_heads=32, num_kv_heads=8,
                       head_dim=head_dim, rope_theta=500000.0, rope_scaling=LLAMA3_ROPE)


STEPS = [[(0, 19), (0, 27)], [(19, 8)], [(27, 1), (27, 1)], [(28, 1), (28, 1)], [(29, 1), (29, 1)]]


def gpu_model(hidden: int, head_dim: int, dtype: torch.dtype) -> LlamaForCausalLM:
    cfg = two_layer_config(hidden, head_dim)
    model = LlamaForCausalLM(cfg, Communicator(Layout(1, 1), 0), dtype, "cuda")
    load_weights(model, ModelSource("dummy", None, cfg), seed=1)
    return model


def step_logits(model: LlamaForCausalLM, device: str, dtype: torch.dtype,
                steps: list = STEPS) -> list[torch.Tensor]:
    """By default a prefill in two chunks (the second starting mid-block) and three decode
    steps of two requests over scattered blocks: the logits of every step."""
    cfg = model.config
    block_size, blocks = 16, [[5, 2, 7], [1, 6, 3]]
    prompts = torch.randint(0, cfg.vocab_size, (2, 27), generator=torch.Generator().manual_seed(2)).tolist()
    tokens = [p + [11, 12, 13] for p in prompts]
    shape = model.kv_cache_shape(8, block_size)
    kv_caches = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                 for _ in model.layers]
    logits = []
    for step in steps:  # (tokens computed so far, tokens this step) per request
        ids, positions, slots, qsl, seq_lens = [], [], [], [0], []
        for b, (start, n) in enumerate(step):
            ids += tokens[b][start:start + n]
            positions += range(start, start + n)
            slots += [blocks[b][p // block_size] * block_size + p % block_size for p in range(start, start + n)]
            qsl.append(qsl[-1] + n)
            seq_lens.append(start + n)
        meta = attention.AttentionMetadata(
            torch.tensor(slots, device=device), torch.tensor(qsl, dtype=torch.int32, device=device),
            torch.tensor(seq_lens, dtype=torch.int32, device=device),
            torch.tensor(blocks[:len(step)], dtype=torch.int32, device=device),
            max(n for _, n in step), max(seq_lens))
        with torch.inference_mode():
            hidden, _ = model(torch.tensor(ids, device=device), torch.tensor(positions, device=device),
                              None, None, meta, kv_caches)
            logits.append(model.compute_logits(hidden))
    return logits


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden, head_dim", [(2048, 64), (4096, 128)], ids=["1b-shapes", "8b-shapes"])
def test_model_on_cuda_matches_cpu_reference(dtype, hidden, head_dim):
    """The logits of every step, kernels against torch."""
    model = gpu_model(hidden, head_dim, dtype)
    cpu_model = LlamaForCausalLM(model.config, Communicator(Layout(1, 1), 0), torch.float32, "cpu")
    cpu_model.load_state_dict({name: t.float().cpu() for name, t in model.state_dict().items()})
    for out, ref in zip(step_logits(model, "cuda", dtype), step_logits(cpu_model, "cpu", torch.float32)):
        assert relative_error(out, ref) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden, head_dim", [(2048, 64), (4096, 128)], ids=["1b-shapes", "8b-shapes"])
def test_fused_kernels_give_the_unfused_logits(dtype, hidden, head_dim, monkeypatch):
    """The embedding fused with the first norm and rotary fused with the KV write compute
    what the unfused kernels compute, bit for bit, in prefill chunks and decodes. (The
    products stay on cuBLAS in both: small_batch_matmul sums in another order.)"""
    monkeypatch.setattr(kernel_flags, "SMALL_BATCH", False)
    model = gpu_model(hidden, head_dim, dtype)
    fused = step_logits(model, "cuda", dtype)
    monkeypatch.setattr(kernel_flags, "FUSED_KERNELS", False)
    unfused = step_logits(model, "cuda", dtype)
    for out, ref in zip(fused, unfused):
        assert torch.equal(out, ref)


ONE_REQUEST_STEPS = [[(0, 19)], [(19, 1)], [(20, 1)], [(21, 1)]]   # decodes: one-row products


@pytest.mark.parametrize("hidden, head_dim", [(2048, 64), (4096, 128)], ids=["1b-shapes", "8b-shapes"])
def test_one_row_products_take_gemv_and_match_cpu_reference(hidden, head_dim, monkeypatch):
    from kernels import gemv as gemv_module
    products = []
    real_gemv = gemv_module.gemv
    monkeypatch.setattr(gemv_module, "gemv",
                        lambda x, w, *a, **kw: products.append((a, kw)) or real_gemv(x, w, *a, **kw))
    model = gpu_model(hidden, head_dim, torch.bfloat16)
    cpu_model = LlamaForCausalLM(model.config, Communicator(Layout(1, 1), 0), torch.float32, "cpu")
    cpu_model.load_state_dict({name: t.float().cpu() for name, t in model.state_dict().items()})
    for out, ref in zip(step_logits(model, "cuda", torch.bfloat16, ONE_REQUEST_STEPS),
                        step_logits(cpu_model, "cpu", torch.float32, ONE_REQUEST_STEPS)):
        assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    # 3 decode steps, each: qkv, o, gate_up and down in both layers, then the LM head;
    # folded in: the second layer's input norm (the first's is the embedding's) and SiLU-and-mul
    assert len(products) == 3 * (4 * 2 + 1)
    assert sum(bool(norm) for norm, _ in products) == 3
    assert sum(bool(kw.get("silu_and_mul")) for _, kw in products) == 3 * 2


@pytest.mark.parametrize("hidden, head_dim", [(2048, 64), (4096, 128)], ids=["1b-shapes", "8b-shapes"])
def test_small_batch_products_take_their_kernel_and_match_cpu_reference(hidden, head_dim, monkeypatch):
    """Products of 2 to 32 rows (an 8-token prefill chunk, decodes of two requests) go to
    kernels/small_batch.py, SiLU-and-mul folded into the gate/up one."""
    from kernels import small_batch
    products = []
    real = small_batch.small_batch_matmul
    monkeypatch.setattr(small_batch, "small_batch_matmul",
                        lambda x, w, *a, **kw: products.append((x.shape[0], a, kw)) or real(x, w, *a, **kw))
    model = gpu_model(hidden, head_dim, torch.bfloat16)
    cpu_model = LlamaForCausalLM(model.config, Communicator(Layout(1, 1), 0), torch.float32, "cpu")
    cpu_model.load_state_dict({name: t.float().cpu() for name, t in model.state_dict().items()})
    for out, ref in zip(step_logits(model, "cuda", torch.bfloat16), step_logits(cpu_model, "cpu", torch.float32)):
        assert relative_error(out, ref) < TOLERANCE[torch.bfloat16]
    # The 8-token chunk and 3 decode steps, each: qkv, o, gate_up and down in both layers,
    # and the LM head over every row (step_logits's)
    assert sorted({rows for rows, _, _ in products}) == [2, 8]
    assert len(products) == 4 * (4 * 2 + 1)
    assert sum(bool(kw.get("silu_and_mul")) for _, _, kw in products) == 4 * 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("hidden, head_dim", [(2048, 64), (4096, 128)], ids=["1b-shapes", "8b-shapes"])
def test_norms_and_silu_folded_into_gemv_give_the_logits_of_their_kernels(dtype, hidden, head_dim,
                                                                          monkeypatch):
    """The norms and SiLU-and-mul folded into the one-row products against their own
    kernels: only the order of the norm's sum of squares differs."""
    model = gpu_model(hidden, head_dim, dtype)
    folded = step_logits(model, "cuda", dtype, ONE_REQUEST_STEPS)
    monkeypatch.setattr(kernel_flags, "GEMV_FOLD", False)
    for out, ref in zip(folded, step_logits(model, "cuda", dtype, ONE_REQUEST_STEPS)):
        assert relative_error(out, ref.cpu()) < TOLERANCE[dtype]


# -- CUDA graphs ------------------------------------------------------------------------

def decode_outputs(max_num_seqs: int, enforce_eager: bool, monkeypatch) -> tuple[list[list[int]], int]:
    """A ModelRunner on tiny-llama (fp32): one prefill step of 3 requests, then 6 decode
    steps. Returns the sampled tokens of each step and how many steps replayed a graph."""
    replays = []
    replay = DecodeGraphs.replay
    monkeypatch.setattr(DecodeGraphs, "replay", lambda self, *a: replays.append(1) or replay(self, *a))
    config = EngineConfig(max_num_seqs=max_num_seqs, enforce_eager=enforce_eager, block_size=4)
    runner = ModelRunner(resolve_model("tiny-llama"), Communicator(Layout(1, 1), 0), torch.float32,
                         torch.device("cuda"), config)
    runner.init_kv_cache(32)
    runner.warmup()
    prompts = [[256, 72, 101, 108, 108], [256, 84, 104], [256] + list(range(60, 70))]
    block_ids = [[3, 9, 21], [12, 0, 4], [30, 1, 17, 8, 25]]
    tokens = [list(p) for p in prompts]
    sampled = []
    req_ids = [f"r{b}" for b in range(len(prompts))]
    for step in range(7):
        new = [seq if step == 0 else seq[-1:] for seq in tokens]
        out = runner.execute_model(SchedulerOutput(
            step, req_ids, [len(seq) - len(n) for seq, n in zip(tokens, new)], new,
            [True] * len(new), [[] for _ in new],
            [NewRequest(r, b, RequestSampling(0.0, 0, 1.0, None, 0)) for r, b in zip(req_ids, block_ids)]
            if step == 0 else [])).output()
        sampled.append(out.sampled_token_ids)
        for seq, token in zip(tokens, out.sampled_token_ids):
            seq.append(token)
    return sampled, len(replays)


def test_decode_steps_replay_graphs_with_eager_tokens(monkeypatch):
    graphed, replays = decode_outputs(max_num_seqs=8, enforce_eager=False, monkeypatch=monkeypatch)
    eager, eager_replays = decode_outputs(max_num_seqs=8, enforce_eager=True, monkeypatch=monkeypatch)
    assert replays == 6 and eager_replays == 0  # the prefill step ran eagerly
    assert graphed == eager


def test_batches_beyond_the_largest_graph_run_eagerly(monkeypatch):
    """max_num_seqs 2 captures sizes 1 and 2; three requests do not fit."""
    sampled, replays = decode_outputs(max_num_seqs=2, enforce_eager=False, monkeypatch=monkeypatch)
    assert replays == 0 and len(sampled) == 7


# -- the engine over real processes ---------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A small HF Llama checkpoint (GQA 4, head_dim 64) with the byte tokenizer: the same
    weights on CPU and on every GPU, whatever the device's random generator."""
    import transformers
    path = tmp_path_factory.mktemp("small-llama")
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=512, intermediate_size=1024,
                                      num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                      max_position_embeddings=1024, bos_token_id=256, eos_token_id=257)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).save_pretrained(path)
    Tokenizer.byte_level().backend.save(str(path / "tokenizer.json"))
    assert json.loads((path / "config.json").read_text())["model_type"] == "llama"
    return str(path)


def generate(model: str, **kwargs) -> list[list[int]]:
    with LLM(model, **kwargs) as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


@pytest.fixture(scope="module")
def cpu_reference(checkpoint) -> list[list[int]]:
    return generate(checkpoint, device="cpu", dtype="float32")


def test_engine_on_cuda_matches_cpu_reference(checkpoint, cpu_reference):
    """fp32, small chunks so that steps mix prefill chunks and decodes; graphs and eager."""
    assert generate(checkpoint, device="cuda", dtype="float32", max_num_batched_tokens=32) == cpu_reference
    assert generate(checkpoint, device="cuda", dtype="float32", enforce_eager=True) == cpu_reference
    assert generate(checkpoint, device="cuda", dtype="float32", async_scheduling=False) == cpu_reference


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs for tp=2 and pp=2")
@pytest.mark.parametrize("tp, pp", [(2, 1), (1, 2)])
def test_tp2_and_pp2_over_nccl_match_cpu_reference(checkpoint, cpu_reference, tp, pp):
    assert generate(checkpoint, device="cuda", dtype="float32", tensor_parallel_size=tp,
                    pipeline_parallel_size=pp) == cpu_reference
