from __future__ import annotations

from gateway.routing.kv_index import ReplicaIndex
from tests.gateway.routing.kv_publisher import removed, stored


def test_stored_blocks_match_from_the_first_on() -> None:
    idx = ReplicaIndex(100)
    idx.apply([stored(1, 2, 3)])
    assert idx.block_size == 16
    assert idx.matched([1, 2, 3, 4]) == 3
    assert idx.matched([1, 9, 3]) == 1  # a prefix: the chain breaks at the first absent block
    assert idx.matched([9, 1]) == 0


def test_removed_and_cleared_blocks_no_longer_match() -> None:
    idx = ReplicaIndex(100)
    idx.apply([stored(1, 2, 3), removed(2)])
    assert idx.matched([1, 2, 3]) == 1
    assert (idx.stored, idx.removed) == (3, 1)
    idx.apply([removed(42)])  # unknown: nothing to remove, not counted
    assert idx.removed == 1
    idx.apply([{"type": "AllBlocksCleared"}, stored(7)])
    assert idx.matched([1]) == 0 and idx.matched([7]) == 1 and idx.cleared == 1


def test_memory_is_bounded_oldest_stored_dropped_first() -> None:
    idx = ReplicaIndex(3)
    idx.apply([stored(1, 2), stored(3)])
    idx.apply([stored(1)])  # stored again (a cache hit re-publishes): the newest now
    idx.apply([stored(4)])
    assert sorted(idx.blocks) == [1, 3, 4]


def test_unknown_events_and_fields_are_ignored() -> None:
    idx = ReplicaIndex(10)
    idx.apply([{"type": "SomethingNew", "block_hashes": [1]}, "junk", {**stored(5), "x": 1}])
    assert list(idx.blocks) == [5]
