"""The paged KV cache's bookkeeping: which blocks each request holds.

The cache is `num_blocks` blocks of `block_size` token slots. Blocks are shared
by reference count. With prefix caching, a block whose tokens are all known is
registered under a chained hash of its tokens (hash of the parent block's hash
and the block's own tokens), so a later request with the same prefix reuses it
instead of recomputing it. A block nobody holds goes to the free queue; if it
has a hash it stays reusable there until it is evicted (least recently freed
first) to serve an allocation.

Block 0 is reserved as the null block: it is never handed out, so a padded
block table (padded with 0) or a padded slot mapping can only touch scratch
space, never another request's KV.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from engine.core.request import Request

NULL_BLOCK_ID = 0


@dataclass
class KVBlock:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None        # set while the block is registered in the prefix cache


class BlockPool:
    """All blocks, the free queue (eviction order) and the prefix cache's hash -> block map."""

    def __init__(self, num_blocks: int):
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        self.free_queue: OrderedDict[int, KVBlock] = OrderedDict(
            (b.block_id, b) for b in self.blocks if b.block_id != NULL_BLOCK_ID)
        self.cached: dict[int, KVBlock] = {}
        self.num_allocated = 0           # cumulative: blocks that went from free to held
        self.num_freed = 0               # cumulative: blocks that went from held to free

    @property
    def num_usable(self) -> int:
        return len(self.blocks) - 1

    @property
    def num_free(self) -> int:
        return len(self.free_queue)

    def take(self, count: int) -> list[KVBlock]:
        """Hand out `count` free blocks, evicting their cached contents."""
        taken = []
        for _ in range(count):
            _, block = self.free_queue.popitem(last=False)
            self._uncache(block)
            block.ref_count = 1
            taken.append(block)
        self.num_allocated += count
        return taken

    def share(self, blocks: list[KVBlock]) -> None:
        """Add a holder to each block (prefix cache hits); pull free ones out of the free queue."""
        for block in blocks:
            if block.ref_count == 0:
                del self.free_queue[block.block_id]
                self.num_allocated += 1
            block.ref_count += 1

    def release(self, blocks: list[KVBlock]) -> None:
        """Drop a holder from each block. Blocks without a hash are reused first; cached
        ones queue at the back, in the order given, so the first given is evicted first."""
        for block in blocks:
            block.ref_count -= 1
            if block.ref_count == 0:
                self.free_queue[block.block_id] = block
                if block.block_hash is None:
                    self.free_queue.move_to_end(block.block_id, last=False)
                self.num_freed += 1

    def cache(self, block: KVBlock, block_hash: int) -> None:
        """Register a full block; the first block with a given hash keeps it."""
        if block_hash not in self.cached:
            self.cached[block_hash] = block
            block.block_hash = block_hash

    def lookup(self, block_hash: int) -> KVBlock | None:
        return self.cached.get(block_hash)

    def _uncache(self, block: KVBlock) -> None:
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            block.block_hash = None


@dataclass
class RequestBlocks:
    blocks: list[KVBlock] = field(default_factory=list)
    hashes: list[int] = field(default_factory=list)  # chained hashes of the full blocks known so far
    num_hashed: int = 0                  # leading blocks already offered to the prefix cache


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool):
        if num_blocks < 2:
            raise ValueError(f"the KV cache needs at least 2 blocks (block 0 is reserved), got {num_blocks}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self.requests: dict[str, RequestBlocks] = {}

    # counters
    @property
    def num_used(self) -> int:
        return self.pool.num_usable - self.pool.num_free

    @property
    def num_free(self) -> int:
        return self.pool.num_free

    @property
    def num_allocated(self) -> int:
        return self.pool.num_allocated

    @property
    def num_freed(self) -> int:
        return self.pool.num_freed

    def get_computed_blocks(self, request: Request) -> list[KVBlock]:
        """The longest run of the request's leading full blocks found in the prefix cache.
        The last token is never counted, so at least one token is computed (to sample from)."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (request.num_tokens - 1) // self.block_size
        hits = []
        for block_hash in self._block_hashes(request)[:max_blocks]:
            block = self.pool.lookup(block_hash)
            if block is None:
                break
            hits.append(block)
        return hits

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[KVBlock] = ()) -> bool:
        """Give the request slots for `computed_blocks` (prefix hits, only when it starts) and
        then `num_new_tokens` more tokens. All or nothing: False leaves everything unchanged."""
        entry = self.requests.get(request.req_id, RequestBlocks())
        num_tokens = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_needed = -(-num_tokens // self.block_size) - len(entry.blocks) - len(computed_blocks)
        num_hits_in_free_queue = sum(1 for b in computed_blocks if b.ref_count == 0)
        if num_needed > self.pool.num_free - num_hits_in_free_queue:
            return False
        self.pool.share(list(computed_blocks))
        entry.blocks += computed_blocks
        entry.blocks += self.pool.take(num_needed)
        self.requests[request.req_id] = entry
        if self.enable_prefix_caching:
            self._cache_full_blocks(request, entry, num_tokens)
        return True

    def free(self, request: Request) -> None:
        """Release the request's blocks. Tail blocks are evicted before head blocks,
        since a head block is the prefix of more sequences."""
        entry = self.requests.pop(request.req_id, None)
        if entry is not None:
            self.pool.release(entry.blocks[::-1])

    def block_ids(self, request: Request, start: int = 0) -> list[int]:
        """The request's block table from entry `start` on."""
        return [b.block_id for b in self.requests[request.req_id].blocks[start:]]

    def _cache_full_blocks(self, request: Request, entry: RequestBlocks, num_tokens: int) -> None:
        """Register the blocks that this step fills, once their tokens are known (a token
        a batch in flight samples is not yet). Their KV is written before any later
        reader runs: within a step each layer writes the cache before attending."""
        num_full = min(num_tokens, request.num_tokens) // self.block_size
        if num_full <= entry.num_hashed:    # most decode steps fill no block
            return
        hashes = self._block_hashes(request, entry)
        for i in range(entry.num_hashed, num_full):
            self.pool.cache(entry.blocks[i], hashes[i])
        entry.num_hashed = num_full

    def _block_hashes(self, request: Request, entry: RequestBlocks | None = None) -> list[int]:
        """Chained hashes of all the request's full blocks, extending the stored list."""
        hashes = entry.hashes if entry is not None else []
        size = self.block_size
        for i in range(len(hashes), request.num_tokens // size):
            parent = hashes[-1] if hashes else None
            hashes.append(hash((parent, tuple(request.token_slice(i * size, (i + 1) * size)))))
        return hashes
