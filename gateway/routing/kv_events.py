"""Subscribe to every replica's KV cache events and keep its index (gateway/routing/kv_index.py).

vLLM started with `--kv-events-config` (worker setting WORKER_KV_EVENTS_PORT) publishes on a ZMQ
PUB socket, per engine step that changed its cache, a multipart message (topic, 8-byte big-endian
sequence number, msgpack batch `[ts, [event, ...], dp_rank]`); each event is a map tagged by
"type": BlockStored (block_hashes, parent_block_hash, token_ids, block_size, lora_name, ...),
BlockRemoved (block_hashes) or AllBlocksCleared. A ROUTER socket on the next port replays the
batches still in the engine's buffer (10,000 by default) from a sequence number on: send
(b"", start as 8 bytes), receive (b"", topic, seq, payload) per batch, then seq -1.

Per replica (its events endpoint: the URL's host and GATEWAY_KV__EVENTS_PORT, or an explicit
entry in GATEWAY_KV__ENDPOINTS) one task:
- on the first batch, replays from 0 what it missed before (ZMQ drops what a subscriber sent
  before it joined); on a gap in the sequence, replays the gap; a gap the buffer no longer holds
  clears the index (a lost removal would make it claim blocks the engine no longer has);
- a sequence number that goes back means a new engine: the index is cleared first;
- the socket's disconnection (the engine's publisher is gone: a crash, a restart, a scale-down)
  clears the index at once and marks it stale until the next batch; the router's new cache life
  for the replica (its probe failed) clears it too (at the next pick, see kv_aware.py).
Every gateway replica subscribes by itself, so all of them see the same indexes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from gateway.routing.kv_index import ReplicaIndex
from gateway.settings import KvSettings

log = logging.getLogger("gateway.kv_events")

END_SEQ = -1


def events_endpoint(url: str, settings: KvSettings) -> str:
    """The ZMQ address of `url`'s event publisher: an explicit entry, else its host and the
    events port. Its replay socket listens on the next port (replay_endpoint)."""
    explicit = settings.endpoints.get(url.rstrip("/"))
    if explicit is not None:
        return explicit
    host = urlsplit(url).hostname or "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"tcp://{host}:{settings.events_port}"


def replay_endpoint(endpoint: str) -> str:
    """The replay socket beside an events endpoint: the same host, the next port (the worker's
    --kv-events-config binds them so, worker/argv.py)."""
    base, _, port = endpoint.rpartition(":")
    return f"{base}:{int(port) + 1}"


class KvEvents:
    """Every replica's index, fed by one subscriber task per replica; `follow` sets the
    replicas (the router's backends, off the hot path)."""

    def __init__(self, settings: KvSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.indexes: dict[str, ReplicaIndex] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._ctx: zmq.asyncio.Context | None = None
        self._clock = clock
        self._decode = msgspec.msgpack.Decoder()
        self.gaps = 0  # gaps replayed
        self.resyncs = 0  # gaps the replay could not fill: index cleared
        self.restarts = 0  # sequence went back or publisher disconnected: index cleared

    def replicas(self) -> list[tuple[str, int, bool]]:
        """(url, blocks held, stale) per replica, for the metrics."""
        return [(u, len(i.blocks), i.stale) for u, i in sorted(self.indexes.items())]

    def totals(self) -> tuple[int, int, int]:
        return self.gaps, self.resyncs, self.restarts

    def follow(self, urls: Iterable[str]) -> None:
        """Subscribe to each of `urls` not yet followed; forget those no longer listed."""
        wanted = {u.rstrip("/") for u in urls}
        for gone in set(self._tasks) - wanted:
            self._tasks.pop(gone).cancel()
            self.indexes.pop(gone, None)
        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        for url in sorted(wanted - set(self._tasks)):
            index = self.indexes[url] = ReplicaIndex(self.settings.max_blocks)
            self._tasks[url] = asyncio.create_task(self._run(url, index),
                                                   name=f"kv-events {url}")

    async def close(self) -> None:
        tasks = list(self._tasks.values())
        for t in tasks:
            t.cancel()
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await t
        self._tasks.clear()
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    # -- one replica -----------------------------------------------------------------------------

    async def _run(self, url: str, index: ReplicaIndex) -> None:
        assert self._ctx is not None
        endpoint = events_endpoint(url, self.settings)
        sub = self._ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, self.settings.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        sub.connect(endpoint)
        watch = asyncio.create_task(self._watch(monitor, index, url), name=f"kv-monitor {url}")
        try:
            while True:
                frames = await sub.recv_multipart()
                if len(frames) != 3:
                    continue
                await self._batch(url, index, int.from_bytes(frames[1], "big", signed=True),
                                  frames[2], endpoint)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("kv events from %s: subscriber failed; its replicas route by "
                          "history now", url)
            index.stale = True
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch
            sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _watch(self, monitor: zmq.asyncio.Socket, index: ReplicaIndex, url: str) -> None:
        while True:
            msg = parse_monitor_message(await monitor.recv_multipart())
            if msg["event"] == zmq.EVENT_CONNECTED:
                # Events flow from here on (an idle engine sends none: that is no staleness).
                index.stale = False
                index.connected = True
            elif msg["event"] == zmq.EVENT_DISCONNECTED:
                # The publisher is gone (engine stopped or restarting): its cache with it.
                index.engine_reset()
                index.stale = True
                index.seq = -1
                self.restarts += 1
                log.info("kv events from %s: publisher disconnected; index cleared", url)

    async def _batch(self, url: str, index: ReplicaIndex, seq: int, payload: bytes,
                     endpoint: str) -> None:
        if index.seq >= 0 and seq <= index.seq:
            # Back to the start: a new engine on the same address.
            index.engine_reset()
            self.restarts += 1
            log.info("kv events from %s: sequence went back (%d after %d); index cleared",
                     url, seq, index.seq)
            index.seq = -1
        if seq > index.seq + 1:
            # Missed batches (a new subscriber, or dropped): fetch them from the replay socket.
            fresh = index.seq < 0
            start = index.seq + 1
            if not fresh:
                self.gaps += 1
            replayed = await self._replay(index, start, seq, replay_endpoint(endpoint))
            if not replayed and not fresh:
                self.resyncs += 1
                log.warning("kv events from %s: batches %d-%d lost; index cleared", url,
                            start, seq - 1)
                index.clear()
        self._apply(index, seq, payload)

    def _apply(self, index: ReplicaIndex, seq: int, payload: bytes) -> None:
        batch: Any = self._decode.decode(payload)
        if isinstance(batch, list) and len(batch) >= 2 and isinstance(batch[1], list):
            index.apply(batch[1])
        index.seq = seq
        index.stale = False
        index.last_event = self._clock()

    async def _replay(self, index: ReplicaIndex, start: int, stop: int, endpoint: str) -> bool:
        """Apply batches start..stop-1 from the replay socket; False if it cannot give them
        all (no answer in time, or its buffer starts later)."""
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        expected = start
        fresh = index.seq < 0
        try:
            await sock.send_multipart((b"", start.to_bytes(8, "big")))
            while True:
                if not await sock.poll(self.settings.replay_timeout_s * 1000):
                    return False
                frames = await sock.recv_multipart()
                if len(frames) != 4:
                    return False
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    return expected >= stop
                if seq >= stop:
                    continue  # we will (or did) get it on the PUB socket
                if seq != expected:
                    if not fresh or expected != start:
                        return False
                    # A new subscriber takes what the buffer still holds: blocks stored before
                    # it are unknown (an underestimate, not a false claim).
                    expected = seq
                self._apply(index, seq, frames[3])
                expected += 1
        finally:
            sock.close(linger=0)
