"""Paged KV-cache bookkeeping: fixed-size blocks, reference counts and prefix caching.

No torch here: this only decides which block ids hold which tokens; the model runner owns the memory.

Prefix caching: a block whose tokens are all computed (their KV is in the cache and none of them is a
rejected draft) gets a chain hash, hash((parent block's hash, its token ids)), so equal hashes mean
equal prefixes. A new request whose prompt starts with cached blocks shares them (reference count + 1)
and skips their computation. A freed block keeps its hash and contents until it is handed out again;
the free list is LRU, so the blocks freed longest ago are evicted first.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


class OutOfBlocks(RuntimeError):
    """Raised by allocate() when asked for more blocks than are free (callers check can_allocate)."""


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: int | None = None  # chain hash once the block is full of computed tokens
    token_ids: tuple[int, ...] = field(default_factory=tuple)  # kept to rule out hash collisions


def chain_hash(parent_hash: int | None, token_ids: Sequence[int]) -> int:
    """The prefix hash of a full block: it depends on every token before it through parent_hash."""
    return hash((parent_hash, tuple(token_ids)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Blocks with ref_count 0, oldest-freed first; cached ones stay findable until handed out.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[int, int] = {}  # chain hash -> block id

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def can_allocate(self, num_blocks: int) -> bool:
        return num_blocks <= len(self._free)

    def allocate(self, num_blocks: int) -> list[int]:
        """Fresh blocks (reference count 1), evicting the least recently freed cached ones."""
        if not self.can_allocate(num_blocks):
            raise OutOfBlocks(f"asked for {num_blocks} blocks, {len(self._free)} free")
        block_ids = []
        for _ in range(num_blocks):
            block_id, _ = self._free.popitem(last=False)
            self._evict(self.blocks[block_id])
            self.blocks[block_id].ref_count = 1
            block_ids.append(block_id)
        return block_ids

    def find_cached_prefix(self, token_ids: Sequence[int]) -> list[int]:
        """Block ids of the longest run of cached full blocks that token_ids starts with."""
        if not self.enable_prefix_caching:
            return []
        block_ids, parent = [], None
        for start in range(0, len(token_ids) - self.block_size + 1, self.block_size):
            chunk = tuple(token_ids[start:start + self.block_size])
            parent = chain_hash(parent, chunk)
            block_id = self._cached.get(parent)
            if block_id is None or self.blocks[block_id].token_ids != chunk:
                break
            block_ids.append(block_id)
        return block_ids

    def share(self, block_ids: Sequence[int]) -> None:
        """Take a reference to cached blocks found by find_cached_prefix."""
        for block_id in block_ids:
            block = self.blocks[block_id]
            if block.ref_count == 0:
                del self._free[block_id]
            block.ref_count += 1

    def free(self, block_ids: Sequence[int]) -> None:
        """Drop one reference to each block; unreferenced blocks go to the back of the free list."""
        for block_id in reversed(block_ids):  # a sequence's tail is the least likely to be shared
            block = self.blocks[block_id]
            if block.ref_count <= 0:
                raise ValueError(f"block {block_id} freed more often than allocated")
            block.ref_count -= 1
            if block.ref_count == 0:
                self._free[block_id] = None

    def cache_full_blocks(self, block_table: Sequence[int], token_ids: Sequence[int],
                          num_cached_blocks: int) -> int:
        """Hash the blocks that became full of computed tokens; returns the new count of hashed blocks.

        token_ids: the request's computed tokens only (never rejected drafts);
        num_cached_blocks: how many leading blocks of block_table were hashed before.
        """
        num_full = len(token_ids) // self.block_size
        if not self.enable_prefix_caching or num_full <= num_cached_blocks:
            return num_cached_blocks
        parent = self.blocks[block_table[num_cached_blocks - 1]].hash if num_cached_blocks else None
        for index in range(num_cached_blocks, num_full):
            chunk = tuple(token_ids[index * self.block_size:(index + 1) * self.block_size])
            parent = chain_hash(parent, chunk)
            block = self.blocks[block_table[index]]
            block.hash, block.token_ids = parent, chunk
            self._cached.setdefault(parent, block.block_id)  # an equal block cached earlier wins
        return num_full

    def _evict(self, block: Block) -> None:
        if block.hash is not None and self._cached.get(block.hash) == block.block_id:
            del self._cached[block.hash]
        block.hash, block.token_ids = None, ()
