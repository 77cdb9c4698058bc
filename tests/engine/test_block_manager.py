"""BlockManager: reference counts, the free list and prefix sharing stay consistent under any sequence."""
from hypothesis import given, settings
from hypothesis import strategies as st

from verifier_service.engine.block_manager import BlockManager

BLOCK_SIZE = 2
NUM_BLOCKS = 12


def check_invariants(manager: BlockManager, holders: dict[int, list[int]]) -> None:
    """Every block's ref count equals its holders; free blocks are exactly the unreferenced ones."""
    expected = [0] * manager.num_blocks
    for table in holders.values():
        for block_id in table:
            expected[block_id] += 1
    assert [b.ref_count for b in manager.blocks] == expected
    assert manager.num_free_blocks == expected.count(0)
    assert manager.num_used_blocks + manager.num_free_blocks == manager.num_blocks
    assert 0.0 <= manager.usage <= 1.0


def admit(manager: BlockManager, tokens: list[int]) -> list[int] | None:
    """What the scheduler does: share the cached prefix, allocate the rest, hash full blocks."""
    cached = manager.find_cached_prefix(tokens[:-1])
    revived = sum(1 for b in cached if manager.blocks[b].ref_count == 0)
    fresh = manager.blocks_needed(len(tokens)) - len(cached)
    if not manager.can_allocate(fresh + revived):
        return None
    manager.share(cached)
    table = cached + manager.allocate(fresh)
    manager.cache_full_blocks(table, tokens, len(cached))
    return table


prompts = st.lists(st.integers(0, 2), min_size=1, max_size=9)  # tiny alphabet: prefixes repeat often
operations = st.lists(st.tuples(st.sampled_from(["admit", "free"]), prompts, st.integers(0, 50)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_invariants_hold_under_random_admit_free_share(ops):
    manager = BlockManager(NUM_BLOCKS, BLOCK_SIZE)
    holders: dict[int, list[int]] = {}
    contents: dict[int, list[int]] = {}
    for number, (op, tokens, pick) in enumerate(ops):
        if op == "admit":
            table = admit(manager, tokens)
            if table is not None:
                holders[number], contents[number] = table, tokens
        elif holders:
            key = sorted(holders)[pick % len(holders)]
            manager.free(holders.pop(key))
        check_invariants(manager, holders)
        # A shared block holds the same tokens for every holder (prefix sharing never mixes contents).
        seen: dict[int, tuple[int, ...]] = {}
        for key, table in holders.items():
            for index, block_id in enumerate(table[:len(contents[key]) // BLOCK_SIZE]):
                chunk = tuple(contents[key][index * BLOCK_SIZE:(index + 1) * BLOCK_SIZE])
                assert seen.setdefault(block_id, chunk) == chunk


def test_same_prefix_shares_full_blocks_and_leaves_the_last_token_to_compute():
    manager = BlockManager(8, 4)
    first = admit(manager, list(range(9)))  # blocks [0..3], [4..7], [8]
    second = admit(manager, list(range(8)) + [99])
    assert second[:2] == first[:2] and second[2] != first[2]
    assert [manager.blocks[b].ref_count for b in first[:2]] == [2, 2]
    # A prompt of exactly two full blocks reuses only the first: its last token must be computed.
    assert manager.find_cached_prefix(list(range(8))[:-1]) == first[:1]


def test_freed_cached_blocks_are_reused_until_evicted_least_recently_freed_first():
    manager = BlockManager(4, 2)
    old = admit(manager, [1, 2, 3])
    manager.free(old)
    assert manager.find_cached_prefix([1, 2, 3]) == old[:1]  # still cached while free
    newer = admit(manager, [5, 6, 7])
    manager.free(newer)
    manager.allocate(2)  # evicts the blocks freed first: old's cached block is gone
    assert manager.find_cached_prefix([1, 2, 3]) == []
    assert manager.find_cached_prefix([5, 6, 7]) == newer[:1]


def test_prefix_caching_off_never_shares():
    manager = BlockManager(8, 2, enable_prefix_caching=False)
    admit(manager, [1, 2, 3])
    assert manager.find_cached_prefix([1, 2, 3]) == []
