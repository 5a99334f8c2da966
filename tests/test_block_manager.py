"""KVCacheManager: ref counts, prefix caching, eviction, all-or-nothing allocation, counters."""
import pytest

from engine.core.block_manager import NULL_BLOCK_ID, KVCacheManager
from engine.core.request import Request
from engine.sampling_params import SamplingParams

BLOCK = 4


def make_request(req_id, tokens):
    return Request(req_id, list(tokens), SamplingParams())


def admit(kv, request):
    """What the scheduler does for a new request: prefix hits, then slots for the rest."""
    hits = kv.get_computed_blocks(request)
    num_cached = len(hits) * BLOCK
    assert kv.allocate_slots(request, request.num_tokens - num_cached, hits)
    request.num_computed_tokens = request.num_tokens
    return num_cached


def test_prefix_hit_shares_blocks_and_counts_refs():
    kv = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True)
    a = make_request("a", range(10))                 # 2 full blocks + 2 tokens
    b = make_request("b", list(range(8)) + [50, 51, 52])
    assert admit(kv, a) == 0
    assert admit(kv, b) == 8
    a_blocks, b_blocks = kv.block_ids(a), kv.block_ids(b)
    assert a_blocks[:2] == b_blocks[:2] and a_blocks[2] != b_blocks[2]
    assert [kv.pool.blocks[i].ref_count for i in a_blocks] == [2, 2, 1]
    assert kv.num_used == 4
    kv.free(a)
    assert [kv.pool.blocks[i].ref_count for i in b_blocks] == [1, 1, 1]
    assert kv.num_used == 3


def test_miss_on_different_prefix_and_last_token_never_cached():
    kv = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True)
    admit(kv, make_request("a", range(8)))
    assert kv.get_computed_blocks(make_request("b", [99] + list(range(1, 8)))) == []
    # the same 8 tokens: only the first block counts, so the last token is computed
    assert len(kv.get_computed_blocks(make_request("c", range(8)))) == 1
    assert len(kv.get_computed_blocks(make_request("d", range(9)))) == 2


def test_chained_hash_depends_on_the_parent_block():
    kv = KVCacheManager(num_blocks=16, block_size=BLOCK, enable_prefix_caching=True)
    admit(kv, make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 0]))
    # second block's tokens equal, first block's differ: no hit at all
    assert kv.get_computed_blocks(make_request("b", [9, 9, 9, 9, 5, 6, 7, 8, 0])) == []


def test_freed_cached_blocks_are_reused_until_evicted_lru():
    kv = KVCacheManager(num_blocks=5, block_size=BLOCK, enable_prefix_caching=True)   # 4 usable
    old = make_request("old", range(0, 9))          # 3 blocks, 2 of them full
    admit(kv, old)
    kv.free(old)
    new = make_request("new", range(100, 105))      # 2 blocks, 1 full
    admit(kv, new)
    kv.free(new)
    assert kv.num_used == 0 and kv.num_free == 4
    assert len(kv.get_computed_blocks(make_request("x", range(0, 9)))) == 2
    # one fresh block: the unhashed blocks go first, so every cached block survives
    admit(kv, make_request("one", [7]))
    assert len(kv.get_computed_blocks(make_request("x", range(0, 9)))) == 2
    assert len(kv.get_computed_blocks(make_request("y", range(100, 105)))) == 1
    # two more: the least recently freed cached blocks ("old", tail first) are evicted
    admit(kv, make_request("two", [7, 7, 7, 7, 7]))
    assert kv.get_computed_blocks(make_request("x", range(0, 9))) == []
    assert len(kv.get_computed_blocks(make_request("y", range(100, 105)))) == 1


def test_allocation_is_all_or_nothing():
    kv = KVCacheManager(num_blocks=5, block_size=BLOCK, enable_prefix_caching=True)
    small = make_request("small", range(8))
    admit(kv, small)
    before = (kv.num_used, kv.num_free, kv.num_allocated)
    big = make_request("big", range(8, 8 + 3 * BLOCK))
    assert not kv.allocate_slots(big, big.num_tokens)
    assert (kv.num_used, kv.num_free, kv.num_allocated) == before
    assert "big" not in kv.requests


def test_hits_in_the_free_queue_count_against_free_blocks():
    kv = KVCacheManager(num_blocks=4, block_size=BLOCK, enable_prefix_caching=True)  # 3 usable
    first = make_request("first", range(9))          # 3 blocks, 2 full and cached
    admit(kv, first)
    kv.free(first)
    again = make_request("again", list(range(8)) + list(range(20, 28)))
    hits = kv.get_computed_blocks(again)
    assert len(hits) == 2
    # 2 hits from the free queue + 2 new blocks > 3 usable blocks
    assert not kv.allocate_slots(again, again.num_tokens - 8, hits)
    assert kv.num_used == 0 and kv.num_free == 3


def test_growing_request_fills_blocks_and_caches_them():
    kv = KVCacheManager(num_blocks=8, block_size=BLOCK, enable_prefix_caching=True)
    req = make_request("r", range(3))
    admit(kv, req)
    assert len(kv.block_ids(req)) == 1
    for token in (3, 4):                             # decode: one token at a time
        req.output_token_ids.append(token)
        assert kv.allocate_slots(req, 1)
        req.num_computed_tokens += 1
    assert len(kv.block_ids(req)) == 2
    assert len(kv.get_computed_blocks(make_request("q", range(6)))) == 1


def test_null_block_is_never_handed_out_and_counters_return_to_zero():
    kv = KVCacheManager(num_blocks=6, block_size=BLOCK, enable_prefix_caching=False)
    requests = [make_request(f"r{i}", range(i * 10, i * 10 + 6)) for i in range(2)]
    for request in requests:
        admit(kv, request)
        assert NULL_BLOCK_ID not in kv.block_ids(request)
    assert kv.num_used == 4 and kv.num_free == 1 and kv.num_allocated == 4
    for request in requests:
        kv.free(request)
    assert kv.num_used == 0 and kv.num_free == 5
    assert kv.num_allocated == kv.num_freed == 4
    assert kv.pool.cached == {}                       # prefix caching off: nothing registered


def test_too_few_blocks_is_a_clear_error():
    with pytest.raises(ValueError, match="at least 2 blocks"):
        KVCacheManager(num_blocks=1, block_size=BLOCK, enable_prefix_caching=True)
