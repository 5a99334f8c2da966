"""The Triton kernels against the engine's torch reference, on fresh random inputs.

With a GPU the kernels are compiled and run at full sizes; without one they run in
Triton's interpreter on CPU tensors at small sizes. The reference always runs in
float32 on CPU copies of the same inputs.
"""
import os
import sys

import torch

if not torch.cuda.is_available():
    if any(name.startswith("kernels.") for name in sys.modules):
        raise RuntimeError("kernels.* was imported before TRITON_INTERPRET=1 was set; "
                           "set it in tests/conftest.py")
    os.environ["TRITON_INTERPRET"] = "1"  # read when @triton.jit runs, i.e. when kernels.* is imported

import dataclasses
import itertools

import pytest

from engine.model import attention as ref_attention
from engine.model import activation as ref_activation
from engine.model import embed_head as ref_embed_head
from engine.model import layernorm as ref_layernorm
from engine.model import rotary_embedding as ref_rotary
from engine.model.attention import AttentionMetadata
from kernels.activation import gate_up_silu, silu_and_mul
from kernels import attention as attention_kernels
from kernels.attention import paged_attention
from kernels.gemv import gemv
from kernels.kv_cache import write_kv
from kernels.norm import embed, rms_norm
from kernels.small_batch import NARROW_TILE, WIDE_TILE, small_batch_matmul
from kernels.rotary import apply_rotary, rotary_write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOLERANCE = {torch.float32: 1e-4, torch.bfloat16: 1e-2, torch.float16: 2e-3}
DTYPES = [pytest.param(dtype, id=str(dtype).removeprefix("torch.")) for dtype in TOLERANCE]


@dataclasses.dataclass
class Sizes:
    kv_heads: int        # KV heads per test (query heads = kv_heads * GQA ratio)
    max_context: int     # longest cached prefix in an attention batch
    num_decodes: int
    tokens: int          # rows for the elementwise kernels
    hidden: int


SIZES = (Sizes(kv_heads=4, max_context=2000, num_decodes=32, tokens=4096, hidden=4096)
         if DEVICE == "cuda" else Sizes(kv_heads=1, max_context=70, num_decodes=3, tokens=5, hidden=96))


@pytest.fixture
def gen():
    """A freshly seeded generator; the seed is printed, so a failure shows it."""
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


def randn(*shape, dtype, gen):
    return torch.randn(*shape, generator=gen).to(dtype=dtype, device=DEVICE)


def randint(low, high, gen) -> int:
    return int(torch.randint(low, high, (1,), generator=gen))


def assert_close(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype):
    """Max error relative to the reference's largest magnitude."""
    error = (out.cpu().float() - ref.float()).abs().max() / ref.float().abs().max()
    assert error <= TOLERANCE[dtype], f"relative error {error:.2e} > {TOLERANCE[dtype]:.0e} ({dtype})"


def build_metadata(context_lens, query_lens, block_size, gen):
    """Block tables over shuffled physical blocks (block 0 included, one block left unowned),
    and the cache slot of every position of every request."""
    seq_lens = [c + q for c, q in zip(context_lens, query_lens)]
    blocks_needed = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_needed) + 1
    physical = torch.randperm(num_blocks, generator=gen)
    block_tables = torch.zeros(len(seq_lens), max(blocks_needed), dtype=torch.int32)
    owned = list(itertools.accumulate(blocks_needed, initial=0))
    for b, n in enumerate(blocks_needed):
        block_tables[b, :n] = physical[owned[b]:owned[b] + n]
    slots = []
    for b, seq_len in enumerate(seq_lens):
        positions = torch.arange(seq_len)
        slots.append(block_tables[b, positions // block_size].long() * block_size + positions % block_size)
    meta = AttentionMetadata(
        slot_mapping=torch.cat([s[c:] for s, c in zip(slots, context_lens)]),
        query_start_loc=torch.tensor([0, *itertools.accumulate(query_lens)], dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=block_tables,
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
    return meta, torch.cat(slots), num_blocks


def mixed_batch(block_size, gen):
    """(context_lens, query_lens): prefill chunks that start and end on and off block edges,
    with and without a cached prefix, then decodes."""
    bs, longest = block_size, SIZES.max_context
    chunks = [
        (0, 1),                                                   # a one-token prompt
        (0, bs + randint(1, bs, gen)),                            # first chunk, ends mid-block
        (bs, bs),                                                 # starts and ends on block edges
        (bs + randint(1, bs, gen), 2 * bs),                       # starts mid-block
        (randint(1, longest, gen), randint(2, longest // 2, gen)),  # anywhere
    ]
    decodes = [(bs - 1, 1), (2 * bs, 1)] + [(randint(1, longest, gen), 1) for _ in range(SIZES.num_decodes)]
    context_lens, query_lens = zip(*(chunks + decodes))
    return list(context_lens), list(query_lens)


def decode_batch(block_size, gen):
    context_lens = [block_size - 1, block_size] + [randint(1, SIZES.max_context, gen)
                                                   for _ in range(SIZES.num_decodes)]
    return context_lens, [1] * len(context_lens)


def check_attention(context_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, gen,
                    capacity=None, launch=None):
    """`capacity`: the max_seq_len the kernel is told, as a decode graph tells it the longest
    context a block table holds; by default the batch's longest. `launch`: the kernel's own
    choice by default."""
    meta, all_slots, num_blocks = build_metadata(context_lens, query_lens, block_size, gen)
    num_positions = all_slots.shape[0]
    k = randn(num_positions, num_kv_heads, head_dim, dtype=dtype, gen=gen)
    v = randn(num_positions, num_kv_heads, head_dim, dtype=dtype, gen=gen)
    q = randn(meta.slot_mapping.shape[0], num_heads, head_dim, dtype=dtype, gen=gen)

    # Unwritten slots hold NaN: reading one would poison the output.
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype, device=DEVICE)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype, device=DEVICE)
    write_kv(k, v, k_cache, v_cache, all_slots.to(DEVICE))
    ref_k_cache = torch.full(cache_shape, float("nan"))
    ref_v_cache = torch.full(cache_shape, float("nan"))
    ref_attention.write_kv(k.cpu().float(), v.cpu().float(), ref_k_cache, ref_v_cache, all_slots)
    torch.testing.assert_close(k_cache.cpu().float(), ref_k_cache, rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(v_cache.cpu().float(), ref_v_cache, rtol=0, atol=0, equal_nan=True)

    device_meta = dataclasses.replace(
        meta, max_seq_len=capacity or meta.max_seq_len, **{f: getattr(meta, f).to(DEVICE) for f in
                                                          ("slot_mapping", "query_start_loc", "seq_lens", "block_tables")})
    scale = head_dim ** -0.5
    out = paged_attention(q, k_cache, v_cache, device_meta, scale, launch)
    ref = ref_attention.paged_attention(q.cpu().float(), ref_k_cache, ref_v_cache, meta, scale)
    assert out.dtype == dtype and out.shape == q.shape
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("gqa", [1, 4, 8])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("block_size", [16, 32])
def test_paged_attention_mixed_batch(dtype, gqa, head_dim, block_size, gen):
    context_lens, query_lens = mixed_batch(block_size, gen)
    kv_heads = SIZES.kv_heads if gqa > 1 else 2 * SIZES.kv_heads
    check_attention(context_lens, query_lens, kv_heads * gqa, kv_heads, head_dim, block_size, dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("gqa", [1, 4, 8])
def test_paged_attention_decode_only(dtype, gqa, gen):
    context_lens, query_lens = decode_batch(16, gen)
    check_attention(context_lens, query_lens, SIZES.kv_heads * gqa, SIZES.kv_heads, 128, 16, dtype, gen)


def program_target():
    return attention_kernels.program_target(torch.device(DEVICE))


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("gqa", [1, 4])
def test_paged_attention_small_decode_batch_splits_its_contexts(dtype, gqa, gen):
    """Batch 1, and batch 3 with contexts of one key and a block less one beside a long one:
    each context in ranges, merged; the ranges are checked to be many."""
    longest = 4 * SIZES.max_context
    for context_lens in ([randint(longest // 2, longest, gen)], [1, 15, randint(longest // 2, longest, gen)]):
        max_seq_len = max(context_lens) + 1
        splits = attention_kernels.decode_splits(len(context_lens), SIZES.kv_heads, 1, max_seq_len,
                                                 program_target())
        assert splits >= 4
        check_attention(context_lens, [1] * len(context_lens), SIZES.kv_heads * gqa, SIZES.kv_heads,
                        128, 16, dtype, gen)


@pytest.mark.parametrize("dtype", DTYPES[:2])
@pytest.mark.parametrize("key_tile", [32, 64])
def test_paged_attention_decodes_at_each_key_tile(dtype, key_tile, gen):
    """A decode batch that is not split takes WHOLE_CONTEXT_DECODE's tile of 64 keys."""
    context_lens, query_lens = decode_batch(16, gen)
    check_attention(context_lens, query_lens, 8, 2, 128, 16, dtype, gen,
                    launch=attention_kernels.Launch(key_tile=key_tile))


def test_paged_attention_split_for_a_graphs_capacity_serves_short_contexts(gen):
    """A decode graph is captured for the longest context a block table holds: most of its
    ranges are empty for a short context, and must not count in the merge."""
    capacity = 16 * attention_kernels.KEY_TILE * attention_kernels.MAX_SPLITS
    assert attention_kernels.decode_splits(2, SIZES.kv_heads, 1, capacity, program_target()) == \
        attention_kernels.MAX_SPLITS
    check_attention([0, 40], [1, 1], 4 * SIZES.kv_heads, SIZES.kv_heads, 64, 16, torch.float32, gen,
                    capacity=capacity)


def test_decode_splits_only_where_the_grid_is_small():
    split = attention_kernels.decode_splits
    assert split(1, 8, 1, 4096, 132) == 16               # 8B at batch 1: 8 programs for 132 SMs
    assert split(4, 8, 1, 4096, 132) == 8
    assert split(32, 8, 1, 4096, 132) == 1              # the grid already fills the GPU
    assert split(1, 8, 7, 4096, 132) == 1               # a prefill chunk in the batch
    assert split(1, 8, 1, 100, 132) == 4                # no more ranges than key tiles (4)
    assert split(1, 8, 1, 1, 132) == 1


@pytest.mark.parametrize("head_dim, block_size, gqa", [(16, 16, 2), (80, 8, 3), (96, 24, 1)])
def test_paged_attention_odd_shapes(head_dim, block_size, gqa, gen):
    """tiny-llama's head_dim 16, head dims and block sizes off powers of two, a GQA ratio of 3."""
    context_lens, query_lens = mixed_batch(block_size, gen)
    check_attention(context_lens, query_lens, 2 * gqa, 2, head_dim, block_size, torch.float32, gen)


def test_paged_attention_rejects_heads_not_a_multiple_of_kv_heads():
    meta, _, _ = build_metadata([0], [4], 16, torch.Generator().manual_seed(0))
    cache = torch.zeros(2, 16, 2, 64, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        paged_attention(torch.zeros(4, 3, 64, device=DEVICE), cache, cache, meta, 0.125)


@pytest.mark.parametrize("dtype", DTYPES)
def test_write_kv_from_qkv_views(dtype, gen):
    """k and v as the engine makes them: strided views into one fused qkv projection."""
    num_tokens, num_heads, num_kv_heads, head_dim, block_size = SIZES.tokens, 4, 2, 64, 16
    num_blocks = -(-num_tokens // block_size) + 2
    qkv = randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, gen=gen)
    _, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    k, v = k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:num_tokens]
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.zeros(cache_shape, dtype=dtype, device=DEVICE) for _ in range(2)]
    ref_caches = [torch.zeros(cache_shape, dtype=dtype) for _ in range(2)]
    write_kv(k, v, *caches, slots.to(DEVICE))
    ref_attention.write_kv(k.cpu(), v.cpu(), *ref_caches, slots)
    for cache, ref_cache in zip(caches, ref_caches):
        assert torch.equal(cache.cpu(), ref_cache)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("hidden", [SIZES.hidden, 100])
def test_rms_norm(dtype, with_residual, hidden, gen):
    x = randn(SIZES.tokens, hidden, dtype=dtype, gen=gen)
    weight = randn(hidden, dtype=dtype, gen=gen)
    residual = randn(SIZES.tokens, hidden, dtype=dtype, gen=gen) if with_residual else None
    out = rms_norm(x, weight, 1e-6, residual)
    ref = ref_layernorm.rms_norm(x.cpu().float(), weight.cpu().float(), 1e-6,
                              residual.cpu().float() if with_residual else None)
    if with_residual:
        (out, new_residual), (ref, ref_residual) = out, ref
        assert_close(new_residual, ref_residual, dtype)
    assert out.dtype == dtype
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim", [16, 64, 128])
def test_apply_rotary_on_qkv_views(dtype, head_dim, gen):
    num_heads, num_kv_heads, max_positions = 4, 2, 4096
    qkv = randn(SIZES.tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, gen=gen)
    q, k, _ = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    q, k = q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim)
    positions = torch.randint(0, max_positions, (SIZES.tokens,), generator=gen)
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 1024}
    cos_sin_cache = ref_rotary.rope_cos_sin_cache(head_dim, max_positions, 500000.0, scaling)
    q_out, k_out = apply_rotary(q, k, positions.to(DEVICE), cos_sin_cache.to(DEVICE))
    q_ref, k_ref = ref_rotary.apply_rotary(q.cpu().float(), k.cpu().float(), positions, cos_sin_cache)
    assert q_out.dtype == k_out.dtype == dtype
    assert_close(q_out, q_ref, dtype)
    assert_close(k_out, k_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("head_dim, block_size", [(64, 16), (80, 8)])
def test_rotary_write_kv_matches_rotary_then_write_kv(dtype, head_dim, block_size, gen):
    """The fused kernel against the unfused torch path (apply_rotary, then write_kv), on
    q, k, v as strided views of one qkv projection; slots scattered over the cache."""
    num_heads, num_kv_heads, max_positions = 4, 2, 4096
    sizes = [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim]
    qkv = randn(SIZES.tokens, sum(sizes), dtype=dtype, gen=gen)
    q, k, v = qkv.split(sizes, dim=-1)
    q, k, v = q.view(-1, num_heads, head_dim), k.view(-1, num_kv_heads, head_dim), v.view(-1, num_kv_heads, head_dim)
    positions = torch.randint(0, max_positions, (SIZES.tokens,), generator=gen)
    cos_sin_cache = ref_rotary.rope_cos_sin_cache(head_dim, max_positions, 500000.0, None)
    num_blocks = -(-SIZES.tokens // block_size) + 2
    slots = torch.randperm(num_blocks * block_size, generator=gen)[:SIZES.tokens]
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    caches = [torch.zeros(cache_shape, dtype=dtype, device=DEVICE) for _ in range(2)]
    ref_caches = [torch.zeros(cache_shape) for _ in range(2)]
    q_out = rotary_write_kv(q, k, v, positions.to(DEVICE), cos_sin_cache.to(DEVICE), *caches, slots.to(DEVICE))
    q_ref = ref_attention.rotary_write_kv(q.cpu().float(), k.cpu().float(), v.cpu().float(), positions,
                                          cos_sin_cache, *ref_caches, slots)
    assert q_out.dtype == dtype and q_out.shape == q.shape
    assert_close(q_out, q_ref, dtype)
    assert_close(caches[0], ref_caches[0], dtype)
    assert torch.equal(caches[1].cpu(), ref_caches[1].to(dtype))  # v is copied, not computed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("vocab_start", [0, 7])
@pytest.mark.parametrize("with_norm", [False, True])
def test_embed_with_and_without_the_first_norm(dtype, vocab_start, with_norm, gen):
    """Ids inside and outside a TP rank's slice [vocab_start, vocab_start + rows) of the
    vocabulary; the fused norm against the unfused gather, then rms_norm."""
    rows, hidden = 50, SIZES.hidden
    table = randn(rows, hidden, dtype=dtype, gen=gen)
    weight = randn(hidden, dtype=dtype, gen=gen) if with_norm else None
    ids = torch.randint(0, vocab_start + rows + 5, (SIZES.tokens,), generator=gen)
    ids[0], ids[-1] = vocab_start, vocab_start + rows  # the first row of the slice; one past its end
    out = embed(ids.to(DEVICE), table, vocab_start, weight, 1e-5)
    ref = ref_embed_head.embed(ids, table.cpu().float(), vocab_start,
                           weight.cpu().float() if with_norm else None, 1e-5)
    if with_norm:
        (out, embedded), (ref, ref_embedded) = out, ref
        assert out.dtype == dtype
        assert_close(out, ref, dtype)
    else:
        embedded, ref_embedded = out, ref
    assert torch.equal(embedded.cpu(), ref_embedded.to(dtype))
    assert not embedded[-1].any()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width", [2 * SIZES.hidden, 2 * 1500])
def test_silu_and_mul(dtype, width, gen):
    """The second width is not a multiple of the kernel's column tile."""
    x = randn(SIZES.tokens, width, dtype=dtype, gen=gen)
    out = silu_and_mul(x)
    assert out.shape == (SIZES.tokens, width // 2) and out.dtype == dtype
    assert_close(out, ref_activation.silu_and_mul(x.cpu().float()), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows", [1, SIZES.tokens, 40])
def test_gate_up_silu_matches_product_then_silu_and_mul(dtype, rows, gen):
    """Row and column counts off the kernel's tiles (hidden 96 + 40 in the interpreter)."""
    hidden, width = (SIZES.hidden, 14336 // 4) if DEVICE == "cuda" else (136, 72)
    x = randn(rows, hidden, dtype=dtype, gen=gen)
    weight = randn(2 * width, hidden, dtype=dtype, gen=gen) / hidden ** 0.5
    out = gate_up_silu(x, weight)
    ref = ref_activation.silu_and_mul(x.cpu().float() @ weight.cpu().float().T)
    assert out.shape == (rows, width) and out.dtype == dtype
    assert_close(out, ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(SIZES.hidden + 16, SIZES.hidden), (37, 136), (48, 1000),
                                   (40, 2 * SIZES.hidden + 8)])
def test_gemv_matches_the_product(dtype, shape, gen):
    """Rows off the kernel's row block (37), K off its column tile (136, 1000, and on a GPU
    8200, which takes the tile for long rows)."""
    rows, k = shape
    x = randn(1, k, dtype=dtype, gen=gen)
    weight = randn(rows, k, dtype=dtype, gen=gen) / k ** 0.5
    out = gemv(x, weight)
    assert out.shape == (1, rows) and out.dtype == dtype
    assert_close(out, x.cpu().float() @ weight.cpu().float().T, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("silu", [False, True], ids=["product", "silu_and_mul"])
@pytest.mark.parametrize("shape", [(2 * SIZES.hidden + 16, SIZES.hidden), (74, 1000)])
def test_gemv_with_the_norm_folded_in(dtype, with_residual, silu, shape, gen):
    """The norm (and SiLU-and-mul after) folded into the product against the separate
    kernels, rms_norm then gemv (then silu_and_mul), each tested against float32 above:
    the same residual bit for bit, the same result but for the order of the norm's sum
    of squares. K 1000 is off the column tile and the row block."""
    rows, k = shape
    x, norm_weight = randn(1, k, dtype=dtype, gen=gen), randn(k, dtype=dtype, gen=gen)
    residual = randn(1, k, dtype=dtype, gen=gen) if with_residual else None
    weight = randn(rows, k, dtype=dtype, gen=gen) / k ** 0.5
    out = gemv(x, weight, norm_weight, 1e-5, residual, silu_and_mul=silu)
    normed = rms_norm(x, norm_weight, 1e-5, residual)
    if with_residual:
        (out, new_residual), (normed, separate_residual) = out, normed
        assert torch.equal(new_residual.cpu(), separate_residual.cpu())
    separate = gemv(normed, weight)
    assert out.shape == (1, rows // 2 if silu else rows) and out.dtype == dtype
    assert_close(out, (silu_and_mul(separate) if silu else separate).cpu(), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(2 * SIZES.hidden, 2 * SIZES.hidden + 8), (74, 1000)])
def test_gemv_with_silu_and_mul_folded_in(dtype, shape, gen):
    """silu(gate) * up of the product's two halves, bit for bit as gemv then
    silu_and_mul's kernel compute it (each tested against float32 above)."""
    rows, k = shape
    x = randn(1, k, dtype=dtype, gen=gen)
    weight = randn(rows, k, dtype=dtype, gen=gen) / k ** 0.5
    out = gemv(x, weight, silu_and_mul=True)
    assert out.shape == (1, rows // 2) and out.dtype == dtype
    assert torch.equal(out.cpu(), silu_and_mul(gemv(x, weight)).cpu())


@pytest.mark.parametrize("dtype", DTYPES[1:])
@pytest.mark.parametrize("rows", [2, 5, 17, 32])
@pytest.mark.parametrize("shape", [(SIZES.hidden + 16, SIZES.hidden), (40, 136), (96, 1000)])
def test_small_batch_matmul_matches_the_product(dtype, rows, shape, gen):
    """Batches off the padded batch (5, 17), weight rows off both tiles (40, 4112), K off
    the column tiles (136, 1000)."""
    n, k = shape
    x = randn(rows, k, dtype=dtype, gen=gen)
    weight = randn(n, k, dtype=dtype, gen=gen) / k ** 0.5
    for tile in (WIDE_TILE, NARROW_TILE):
        out = small_batch_matmul(x, weight, tile=tile)
        assert out.shape == (rows, n) and out.dtype == dtype
        assert_close(out, x.cpu().float() @ weight.cpu().float().T, dtype)


@pytest.mark.parametrize("dtype", DTYPES[1:])
@pytest.mark.parametrize("rows", [3, 32])
@pytest.mark.parametrize("halves", ["on_tiles", "ragged"])
def test_small_batch_matmul_with_silu_and_mul_folded_in(dtype, rows, halves, gen):
    """silu(gate) * up of the product's two halves, as the product then silu_and_mul's
    kernel compute it, at the same tile: bit for bit where each half fills whole tiles,
    so both kernels multiply the same tiles. With a ragged half an up row sits at another
    place of its tile in the plain product, and the interpreter's matmul may sum it in
    another order: within the dtype's tolerance there."""
    k = SIZES.hidden if DEVICE == "cuda" else 136
    n = 2 * (k if DEVICE == "cuda" else 2 * NARROW_TILE.block_n) if halves == "on_tiles" else 80
    x = randn(rows, k, dtype=dtype, gen=gen)
    weight = randn(n, k, dtype=dtype, gen=gen) / k ** 0.5
    out = small_batch_matmul(x, weight, silu_and_mul=True, tile=NARROW_TILE)
    assert out.shape == (rows, n // 2) and out.dtype == dtype
    separate = silu_and_mul(small_batch_matmul(x, weight, tile=NARROW_TILE)).cpu()
    if halves == "on_tiles":
        assert torch.equal(out.cpu(), separate)
    else:
        assert_close(out, separate, dtype)


def test_small_batch_matmul_refuses_a_weight_of_another_width():
    with pytest.raises(ValueError, match=r"small_batch_matmul needs x \[M, 8\]"):
        small_batch_matmul(torch.zeros(2, 6, device=DEVICE), torch.zeros(4, 8, device=DEVICE))


def test_gemv_refuses_more_than_one_row():
    with pytest.raises(ValueError, match=r"gemv needs x \[1, 8\]"):
        gemv(torch.zeros(2, 8, device=DEVICE), torch.zeros(4, 8, device=DEVICE))
