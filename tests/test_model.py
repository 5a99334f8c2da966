"""The model against transformers, through the paged KV cache; and split over real ranks."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from engine.communicator import Communicator, Layout
from engine.model.attention import AttentionMetadata
from engine.model.linear import ColumnParallelLinear, linear, pack_linears
from engine.model.llama import LlamaForCausalLM, stage_layers
from engine.model.loader import load_weights, resolve_model

BLOCK_SIZE = 4


@pytest.fixture(autouse=True, scope="module")
def one_torch_thread():
    """Two threads on two shared cores spin against each other: ten times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class PagedRequest:
    """One sequence's place in the paged cache: its tokens so far and its (scattered) blocks."""

    def __init__(self, token_ids: list[int], block_ids: list[int]):
        self.token_ids = token_ids
        self.block_ids = block_ids
        self.num_computed = 0


def step_inputs(chunks: list[tuple[PagedRequest, int]]):
    """input_ids, positions and metadata to compute the next `n` tokens of each request."""
    slots, positions, input_ids, query_starts, seq_lens = [], [], [], [0], []
    for request, n in chunks:
        start = request.num_computed
        for pos in range(start, start + n):
            slots.append(request.block_ids[pos // BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE)
        positions += range(start, start + n)
        input_ids += request.token_ids[start:start + n]
        query_starts.append(query_starts[-1] + n)
        seq_lens.append(start + n)
        request.num_computed += n
    width = max(len(request.block_ids) for request, _ in chunks)
    tables = [request.block_ids + [0] * (width - len(request.block_ids)) for request, _ in chunks]
    meta = AttentionMetadata(
        slot_mapping=torch.tensor(slots), query_start_loc=torch.tensor(query_starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32), block_tables=torch.tensor(tables, dtype=torch.int32),
        max_query_len=max(n for _, n in chunks), max_seq_len=max(seq_lens))
    return torch.tensor(input_ids), torch.tensor(positions), meta


def run_step(model, kv_caches, chunks: list[tuple[PagedRequest, int]]) -> list[torch.Tensor]:
    """One forward over all chunks; the logits of each request's new tokens."""
    input_ids, positions, meta = step_inputs(chunks)
    with torch.inference_mode():
        hidden, _ = model(input_ids, positions, None, None, meta, kv_caches)
        logits = model.compute_logits(hidden)
    return list(logits.split([n for _, n in chunks]))


def new_kv_caches(model, num_blocks=16):
    shape = model.kv_cache_shape(num_blocks, BLOCK_SIZE)
    return [(torch.zeros(shape), torch.zeros(shape)) for _ in model.layers]


def load_model(source, comm=None, seed=0):
    model = LlamaForCausalLM(source.model_config, comm or Communicator(Layout(1, 1), 0), torch.float32, "cpu")
    load_weights(model, source, seed)
    return model


def assert_close_relative(ours, theirs, tol):
    error = (ours - theirs).abs().max() / theirs.abs().max()
    assert error < tol, f"max error {error:.2e} of the logits' scale"


def tiny_hf_model(kind: str):
    import transformers
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                  rms_norm_eps=1e-6)
    if kind == "llama":
        config = transformers.LlamaConfig(
            **common, tie_word_embeddings=True,
            rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                          "high_freq_factor": 4.0, "original_max_position_embeddings": 32})
        model = transformers.LlamaForCausalLM(config)
    else:
        model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common, rope_theta=1000.0))
    torch.manual_seed(0)
    with torch.no_grad():  # every weight random, norms near 1, so a misplaced one shows
        for name, param in model.named_parameters():
            param.normal_(1.0 if "norm" in name else 0.0, 0.1 if "norm" in name else 0.08)
    return model.eval()


@pytest.mark.unit
def test_bf16_weights_prepared_once_on_the_cpu_give_the_plain_products_logits(tmp_path):
    """pack_linears packs each bf16 projection for oneDNN, or widens it to float32 where
    the CPU lacks bf16 dot products: the logits stay those of the plain bf16 products,
    and the plain weights are gone (the tied embedding keeps its own)."""
    tiny_hf_model("llama").save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    models = []
    for prepare in (False, True):
        model = LlamaForCausalLM(source.model_config, Communicator(Layout(1, 1), 0),
                                 torch.bfloat16, "cpu")
        load_weights(model, source, 0)
        if prepare:
            pack_linears(model)
        models.append(model)
    plain, prepared = models
    projections = [m for m in prepared.modules() if hasattr(m, "packed")]
    assert projections and all(m.weight is None and (m.packed is not None or m.widened is not None)
                               for m in projections)
    assert prepared.embed_tokens.weight is not None
    tokens = torch.randint(0, 300, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    logits = []
    for model in models:
        shape = model.kv_cache_shape(8, BLOCK_SIZE)
        caches = [(torch.zeros(shape, dtype=torch.bfloat16), torch.zeros(shape, dtype=torch.bfloat16))
                  for _ in model.layers]
        logits += run_step(model, caches, [(PagedRequest(tokens, [3, 1, 6]), 12)])
    assert_close_relative(logits[1], logits[0], 3e-2)


@pytest.mark.unit
def test_a_widened_bf16_weight_gives_the_bf16_product():
    """The float32 copy's product, rounded back, is the bf16 product up to the order of
    the sums: within one bf16 step of it."""
    layer = ColumnParallelLinear(64, [96], Communicator(Layout(1, 1), 0), False, torch.bfloat16, "cpu")
    torch.nn.init.normal_(layer.weight, 0.0, 0.1)
    x = torch.randn(5, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(3))
    expected = torch.nn.functional.linear(x, layer.weight)
    layer.widened, layer.weight = layer.weight.float(), None
    out = linear(x, layer)
    assert out.dtype == torch.bfloat16
    assert ((out.float() - expected.float()).abs() <= expected.float().abs() / 128 + 1e-3).all()


@pytest.mark.unit
def test_a_bf16_projection_with_a_bias_prepared_once_gives_the_bf16_product():
    """Packed or widened by pack_linears, as the CPU allows, a projection with a bias
    (Qwen2's qkv) gives the plain bf16 product within one bf16 step."""
    layer = ColumnParallelLinear(64, [96], Communicator(Layout(1, 1), 0), True, torch.bfloat16, "cpu")
    torch.nn.init.normal_(layer.weight, 0.0, 0.1)
    torch.nn.init.normal_(layer.bias, 0.0, 0.5)
    x = torch.randn(5, 64, dtype=torch.bfloat16, generator=torch.Generator().manual_seed(4))
    expected = torch.nn.functional.linear(x, layer.weight, layer.bias)
    pack_linears(torch.nn.Sequential(layer))
    out = linear(x, layer)
    assert layer.weight is None and out.dtype == torch.bfloat16
    assert ((out.float() - expected.float()).abs() <= expected.float().abs() / 128 + 1e-3).all()


@pytest.mark.unit
def test_engine_widen_bf16_0_keeps_the_weights_bf16_where_they_would_be_widened(monkeypatch):
    """A host short of memory keeps the bf16 weights (oneDNN then widens each at every
    product); where the CPU has bf16 dot products they are packed all the same."""
    monkeypatch.setenv("ENGINE_WIDEN_BF16", "0")
    layer = ColumnParallelLinear(64, [96], Communicator(Layout(1, 1), 0), False, torch.bfloat16, "cpu")
    pack_linears(torch.nn.Sequential(layer))
    assert layer.widened is None
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        assert layer.weight is None and layer.packed is not None
    else:
        assert layer.weight.dtype == torch.bfloat16 and layer.packed is None


@pytest.mark.e2e
@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_hf_checkpoint_matches_transformers_through_paged_cache(tmp_path, kind):
    hf_model = tiny_hf_model(kind)
    hf_model.save_pretrained(tmp_path)
    source = resolve_model(str(tmp_path))
    assert source.kind == "hf" and source.model_config.attention_bias == (kind == "qwen2")
    model = load_model(source)

    tokens = torch.randint(0, 300, (21,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        expected = hf_model(torch.tensor([tokens])).logits[0]

    kv_caches = new_kv_caches(model)
    whole = PagedRequest(tokens, block_ids=[9, 2, 14, 5, 0, 11])
    (logits,) = run_step(model, kv_caches, [(whole, 21)])
    assert_close_relative(logits, expected, 1e-4)

    # Two chunks, the second batched with another request's decode steps, in other blocks.
    chunked = PagedRequest(tokens, block_ids=[3, 7, 1, 12, 8, 15])
    decoding = PagedRequest(tokens, block_ids=[4, 6, 10, 13, 9, 2])
    first, prompt = run_step(model, kv_caches, [(chunked, 6), (decoding, 12)])
    assert_close_relative(first, expected[:6], 1e-4)
    assert_close_relative(prompt, expected[:12], 1e-4)
    second, step = run_step(model, kv_caches, [(chunked, 15), (decoding, 1)])
    assert_close_relative(second, expected[6:], 1e-4)
    decoded = [step]
    while decoding.num_computed < len(tokens):
        decoded += run_step(model, kv_caches, [(decoding, 1)])
    assert_close_relative(torch.cat(decoded), expected[12:], 1e-4)


def test_stage_layers_split_evenly_with_remainder_first():
    assert [stage_layers(10, p, 4) for p in range(4)] == [range(0, 3), range(3, 6), range(6, 8), range(8, 10)]
    assert [stage_layers(30, p, 1) for p in range(1)] == [range(30)]


# --- smollm2-135m: the real GGUF, against transformers loading the same file ---

@pytest.fixture(scope="module")
def smollm2():
    source = resolve_model("smollm2-135m")
    return source, source.tokenizer(), load_model(source)


def hf_greedy(hf_model, prompt_ids: list[int], num_tokens: int) -> list[int]:
    with torch.no_grad():
        out = hf_model(torch.tensor([prompt_ids]), use_cache=True)
        generated = []
        for _ in range(num_tokens):
            generated.append(int(out.logits[0, -1].argmax()))
            out = hf_model(torch.tensor([[generated[-1]]]), cache=out.cache, use_cache=True)
    return generated


@pytest.mark.e2e
def test_smollm2_greedy_matches_transformers_gguf(smollm2):
    from transformers import AutoModelForCausalLM
    source, tokenizer, model = smollm2
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Name three colours of the rainbow."}])
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    num_tokens = 32

    request = PagedRequest(list(prompt_ids), block_ids=list(range(40, 0, -1)))
    kv_caches = new_kv_caches(model, num_blocks=41)
    half = len(prompt_ids) // 2
    run_step(model, kv_caches, [(request, half)])
    (logits,) = run_step(model, kv_caches, [(request, len(prompt_ids) - half)])
    ours = []
    while len(ours) < num_tokens:
        ours.append(int(logits[-1].argmax()))
        request.token_ids.append(ours[-1])
        (logits,) = run_step(model, kv_caches, [(request, 1)])

    hf_model = AutoModelForCausalLM.from_pretrained(source.path.parent, gguf_file=source.path.name,
                                                    dtype=torch.float32).eval()
    assert ours == hf_greedy(hf_model, prompt_ids, num_tokens), tokenizer.decode(ours)


# --- tensor and pipeline parallel over real gloo ranks ---

def _parallel_rank(rank: int, out_dir: str, prompt: list[int]):
    torch.set_num_threads(1)
    source = resolve_model("tiny-llama")
    comm = Communicator(Layout(2, 1), rank, init_method=f"file://{out_dir}/tp-init")
    results = {"tp": run_prefill_and_decode(load_model(source, comm, seed=7), prompt)}
    comm.close()
    comm = Communicator(Layout(1, 2), rank, init_method=f"file://{out_dir}/pp-init")
    results["pp"] = run_pipelined(load_model(source, comm, seed=7), comm, prompt)
    comm.close()
    torch.save(results, f"{out_dir}/rank{rank}.pt")


def run_prefill_and_decode(model, prompt):
    request = PagedRequest(prompt, block_ids=[5, 1, 3, 0, 2])
    kv_caches = new_kv_caches(model, num_blocks=6)
    logits = run_step(model, kv_caches, [(request, 9)])
    while request.num_computed < len(prompt):
        logits += run_step(model, kv_caches, [(request, 1)])
    return torch.cat(logits)


def run_pipelined(model, comm, prompt):
    """The prompt through two stages: stage 0 sends (hidden, residual) on, stage 1 ends it."""
    input_ids, positions, meta = step_inputs([(PagedRequest(prompt, block_ids=[5, 1, 3, 0, 2]), len(prompt))])
    kv_caches = new_kv_caches(model, num_blocks=6)
    with torch.inference_mode():
        if comm.is_first_stage:
            hidden, residual = model(input_ids, positions, None, None, meta, kv_caches)
            comm.send([hidden, residual], comm.next_stage_rank())
            return None
        like = [((len(prompt), model.config.hidden_size), torch.float32)] * 2
        hidden, residual = comm.recv(like, comm.prev_stage_rank())
        hidden, _ = model(None, positions, hidden, residual, meta, kv_caches)
        return model.compute_logits(hidden)


@pytest.mark.e2e
def test_tp2_and_pp2_match_one_rank(tmp_path):
    prompt = torch.randint(0, 512, (17,), generator=torch.Generator().manual_seed(3)).tolist()
    expected = run_prefill_and_decode(load_model(resolve_model("tiny-llama"), seed=7), prompt)

    mp.spawn(_parallel_rank, args=(str(tmp_path), prompt), nprocs=2, join=True)
    rank0, rank1 = (torch.load(tmp_path / f"rank{r}.pt") for r in range(2))
    assert rank0["tp"].shape == (len(prompt), 512)
    assert_close_relative(rank0["tp"], expected, 1e-5)
    assert_close_relative(rank1["tp"], expected, 1e-5)
    assert rank0["pp"] is None
    assert_close_relative(rank1["pp"], expected, 1e-5)
