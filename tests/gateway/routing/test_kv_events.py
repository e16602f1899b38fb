"""The subscriber against a publisher speaking vLLM's protocol on loopback (real ZMQ sockets)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import zmq.asyncio

from gateway.routing.kv_events import KvEvents, events_endpoint, replay_endpoint
from gateway.routing.kv_index import ReplicaIndex
from gateway.settings import KvSettings
from tests.gateway.routing.kv_publisher import Publisher, removed, stored
from tests.ports import free_port_pair
from tests.waiting import settle

URL = "http://127.0.0.1:8001"


@pytest.fixture
async def ctx() -> AsyncIterator[zmq.asyncio.Context]:
    c = zmq.asyncio.Context()
    yield c
    c.destroy(linger=0)


# How long a batch may take to reach the index, on a loaded machine.
WAIT_S = 15.0


async def subscribed(pub: Publisher) -> tuple[KvEvents, ReplicaIndex]:
    """A gateway's subscriber to `pub`, returned once its subscription reached the publisher:
    ZMQ drops what is published before (a later batch replays it, but a test's only batch would
    be lost), and the subscription takes its way after the connection, on a loaded machine
    longer than any fixed wait."""
    want = pub.subscriptions + 1
    events = KvEvents(KvSettings(endpoints={URL: f"tcp://127.0.0.1:{pub.port}"},
                                 replay_timeout_s=10))
    events.follow([URL])
    index = events.indexes[URL]
    await settle(lambda: not index.stale, WAIT_S)  # connected
    await pub.subscribed(want)
    return events, index


def test_endpoints_follow_the_replica_host_or_the_explicit_map() -> None:
    s = KvSettings(events_port=5557, endpoints={"http://a:8001/": "tcp://a:6000"})
    assert events_endpoint("http://10.0.0.7:8000", s) == "tcp://10.0.0.7:5557"
    assert events_endpoint("http://[fd00::7]:8000", s) == "tcp://[fd00::7]:5557"
    assert events_endpoint("http://a:8001", s) == "tcp://a:6000"
    assert replay_endpoint("tcp://a:6000") == "tcp://a:6001"


async def test_batches_build_the_index(ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port)
    events, index = await subscribed(pub)
    try:
        pub.batch(stored(1, 2, 3))
        pub.batch(removed(2), stored(4))
        await settle(lambda: index.seq == 1, WAIT_S)
        assert sorted(index.blocks) == [1, 3, 4] and index.block_size == 16
    finally:
        await events.close()
        await pub.close()


async def test_a_late_subscriber_replays_what_it_missed(ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port)
    pub.batch(stored(1, 2))  # before anyone listened: ZMQ drops it
    pub.batch(removed(1))
    events, index = await subscribed(pub)
    try:
        pub.batch(stored(3))
        await settle(lambda: index.seq == 2, WAIT_S)
        assert sorted(index.blocks) == [2, 3] and pub.replays == 1
    finally:
        await events.close()
        await pub.close()


async def test_a_gap_is_replayed_and_one_the_buffer_lost_clears(
        ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port, buffer=3)
    events, index = await subscribed(pub)
    try:
        pub.batch(stored(1, 2))
        await settle(lambda: index.seq == 0, WAIT_S)
        pub.batch(removed(1), publish=False)  # dropped on the way
        pub.batch(stored(5))
        await settle(lambda: index.seq == 2, WAIT_S)
        assert sorted(index.blocks) == [2, 5] and (events.gaps, events.resyncs) == (1, 0)
        for h in (6, 7, 8, 9):  # more lost than the engine's buffer keeps, removals among them
            pub.batch(removed(2), stored(h), publish=False)
        pub.batch(stored(10))
        await settle(lambda: index.seq == 7, WAIT_S)
        # The removal of 2 is lost for good: the index forgets everything rather than claim it.
        assert 2 not in index.blocks and 10 in index.blocks and events.resyncs == 1
    finally:
        await events.close()
        await pub.close()


async def test_a_new_engine_on_the_same_address_starts_a_new_index(
        ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port)
    events, index = await subscribed(pub)
    try:
        for h in (1, 2, 3):
            pub.batch(stored(h))
        await settle(lambda: index.seq == 2, WAIT_S)
        # The engine stops: the subscriber sees its publisher go, and forgets its cache at once.
        await pub.close()
        await settle(lambda: index.stale, WAIT_S)
        assert not index.blocks and events.restarts >= 1 and index.generation >= 1
        pub = Publisher(ctx, port)  # the restarted engine: its sequence starts at 0 again
        await settle(lambda: not index.stale, WAIT_S)
        await pub.subscribed(1)
        pub.batch(stored(9))
        await settle(lambda: index.seq == 0, WAIT_S)
        assert list(index.blocks) == [9]
    finally:
        await events.close()
        await pub.close()


async def test_a_sequence_that_goes_back_clears_the_index(ctx: zmq.asyncio.Context) -> None:
    # A restart faster than the disconnection is seen: the sequence number tells.
    port = free_port_pair()
    pub = Publisher(ctx, port)
    events, index = await subscribed(pub)
    try:
        pub.batch(stored(1))
        pub.batch(stored(2))
        await settle(lambda: index.seq == 1, WAIT_S)
        pub.seq = 0
        pub.buffer.clear()
        pub.batch(stored(3))
        await settle(lambda: index.seq == 0, WAIT_S)
        assert list(index.blocks) == [3]
    finally:
        await events.close()
        await pub.close()


async def test_replicas_that_leave_are_unsubscribed(ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port)
    events, _ = await subscribed(pub)
    try:
        events.follow([])
        assert events.indexes == {} and not events._tasks
    finally:
        await events.close()
        await pub.close()


async def test_gateway_replicas_each_subscribing_see_the_same_index(
        ctx: zmq.asyncio.Context) -> None:
    port = free_port_pair()
    pub = Publisher(ctx, port)
    pub.batch(stored(1, 2))  # before either subscribed
    (a, ia), (b, ib) = await subscribed(pub), await subscribed(pub)
    try:
        pub.batch(stored(3), removed(1))
        await settle(lambda: ia.seq == 1 and ib.seq == 1, WAIT_S)
        assert list(ia.blocks) == list(ib.blocks) == [2, 3]
    finally:
        await a.close()
        await b.close()
        await pub.close()
