"""An engine's KV event publisher on loopback, speaking vLLM 0.32's wire protocol
(vllm/distributed/kv_events.py ZmqEventPublisher: PUB (topic, seq, msgpack batch) and a ROUTER
replay socket); tests/e2e/test_kv_events.py checks the real engine's against the gateway."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import zmq
import zmq.asyncio

END_SEQ = (-1).to_bytes(8, "big", signed=True)


class Publisher:
    def __init__(self, ctx: zmq.asyncio.Context, port: int, replay: bool = True,
                 buffer: int = 10_000) -> None:
        self.port = port
        # XPUB where vLLM has PUB: the same socket to a subscriber, which also hands each
        # subscription that reached it to the application, so that a test can wait for one
        # (`subscribed`) instead of guessing how long its way takes. Verbose: every subscriber's,
        # not only the first of a topic.
        self.pub = ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)
        self.subscriptions = 0
        self.pub.bind(f"tcp://127.0.0.1:{port}")
        self.router: zmq.asyncio.Socket | None = None
        if replay:
            self.router = ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.router.bind(f"tcp://127.0.0.1:{port + 1}")
        self.seq = 0
        self.buffer: list[tuple[int, bytes]] = []
        self.keep = buffer
        self.replays = 0
        self._enc = msgspec.msgpack.Encoder()
        self._task = asyncio.create_task(self._serve()) if replay else None

    def batch(self, *events: dict[str, Any], publish: bool = True) -> int:
        """One batch (as vLLM encodes it: [ts, events, dp_rank]); `publish=False` keeps it for
        replay only (a batch the subscriber missed)."""
        payload = self._enc.encode([0.0, list(events), 0])
        seq = self.seq
        self.seq += 1
        self.buffer.append((seq, payload))
        del self.buffer[:-self.keep]
        if publish:
            self.pub.send_multipart((b"", seq.to_bytes(8, "big"), payload))
        return seq

    async def subscribed(self, n: int, timeout_s: float = 30.0) -> None:
        """Return once `n` subscriptions in all have reached the publisher: from then on, what it
        publishes reaches their subscribers (ZMQ drops what it publishes before)."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.subscriptions < n:
                    if (await self.pub.recv())[:1] == b"\x01":  # \x00 is an unsubscription
                        self.subscriptions += 1
        except TimeoutError:
            raise AssertionError(f"{self.subscriptions} of {n} subscriptions reached the "
                                 f"publisher in {timeout_s:g} s") from None

    async def _serve(self) -> None:
        assert self.router is not None
        while True:
            client, _, start = await self.router.recv_multipart()
            self.replays += 1
            first = int.from_bytes(start, "big")
            for seq, payload in self.buffer:
                if seq >= first:
                    await self.router.send_multipart(
                        (client, b"", b"", seq.to_bytes(8, "big"), payload))
            await self.router.send_multipart((client, b"", b"", END_SEQ, b""))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.pub.close(linger=0)
        if self.router is not None:
            self.router.close(linger=0)


def stored(*hashes: int, size: int = 16) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": None,
            "token_ids": [0] * size * len(hashes), "block_size": size, "lora_id": None,
            "medium": "GPU", "lora_name": None}


def removed(*hashes: int) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": "GPU"}
