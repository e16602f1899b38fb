"""The bounded wait queue of one pool: strict priority classes, deficit round robin per tenant.

- Classes (high, normal, low) are served strictly in order.
- Within a class, tenants (API keys) with waiting requests take turns; a turn serves `weight`
  requests on average, so a tenant sending ten times the traffic only lengthens its own line.
- When full, a newcomer may push out the newest request of the tenant holding the most places
  (in a lower class, or in its own if that tenant holds more than the newcomer would), so one
  key's flood cannot lock others out either; otherwise the newcomer is refused.
- Timeouts and disconnects mark an entry dead (skipped when reached): O(1) removal, exact counts.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

N_CLASSES = 3


@dataclass(slots=True, eq=False)
class Waiter:
    future: asyncio.Future[None]
    tenant: str
    cls: int
    weight: float
    enqueued: float
    live: bool = True
    stream: bool = True  # its answer streams (admission.Pool's slow start watches first tokens)


@dataclass(slots=True)
class _Class:
    lines: dict[str, deque[Waiter]] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    deficit: dict[str, float] = field(default_factory=dict)
    ring: deque[str] = field(default_factory=deque)
    topped: bool = False  # the ring head already got this turn's quantum
    size: int = 0


class FairQueue:
    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._classes = [_Class() for _ in range(N_CLASSES)]
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, w: Waiter) -> Waiter | None:
        """Enqueue `w`. Returns a waiter pushed out to make room (the caller refuses it).

        Raises `QueueFull` when `w` itself cannot get a place."""
        evicted = None
        if self._size >= self.max_size:
            evicted = self._victim_for(w)
            if evicted is None:
                raise QueueFull()
            self.remove(evicted)
        c = self._classes[w.cls]
        line = c.lines.get(w.tenant)
        if line is None:
            line = c.lines[w.tenant] = deque()
            c.live[w.tenant] = 0
            c.deficit[w.tenant] = 0.0
            c.ring.append(w.tenant)
        line.append(w)
        c.live[w.tenant] += 1
        c.size += 1
        self._size += 1
        return evicted

    def remove(self, w: Waiter) -> None:
        """Take `w` out (timeout, disconnect, eviction). Idempotent."""
        if not w.live:
            return
        w.live = False
        c = self._classes[w.cls]
        c.live[w.tenant] -= 1
        c.size -= 1
        self._size -= 1

    def pop(self) -> Waiter | None:
        for c in self._classes:
            if c.size:
                return self._pop_class(c)
        return None

    def _pop_class(self, c: _Class) -> Waiter:
        while True:
            t = c.ring[0]
            line = c.lines[t]
            while line and not line[0].live:
                line.popleft()
            if not line:
                self._retire(c, t)
                continue
            if not c.topped:
                c.deficit[t] += line[0].weight
                c.topped = True
            if c.deficit[t] >= 1.0:
                c.deficit[t] -= 1.0
                w = line.popleft()
                self.remove(w)
                if not c.live[t]:
                    self._retire(c, t)
                return w
            c.ring.rotate(-1)
            c.topped = False

    def _retire(self, c: _Class, t: str) -> None:
        """`t`, the ring's head, has nothing live left in `c`: it leaves the ring and forgets its
        deficit (DRR)."""
        c.ring.popleft()
        c.topped = False
        del c.lines[t], c.live[t], c.deficit[t]

    def _victim_for(self, w: Waiter) -> Waiter | None:
        for cls in range(N_CLASSES - 1, w.cls - 1, -1):
            c = self._classes[cls]
            if not c.size:
                continue
            tenant, held = max(c.live.items(), key=lambda kv: kv[1])
            mine = c.live.get(w.tenant, 0) if cls == w.cls else -1
            if held > mine + 1:
                for cand in reversed(c.lines[tenant]):
                    if cand.live:
                        return cand
        return None

    def ahead_of(self, tenant: str, cls: int, weight: float) -> int:
        """About how many queued requests would be served before a new one from `tenant`.

        Strict priority puts every higher class ahead; in its own class round robin lets each
        other tenant go about `weight_t / weight` times per place of ours, capped by its line."""
        ahead = sum(self._classes[k].size for k in range(cls))
        c = self._classes[cls]
        mine = c.live.get(tenant, 0) + 1
        for t, n in c.live.items():
            if t == tenant:
                ahead += n
            elif n:  # a tenant with live waiters: its line holds them, and their weight
                ahead += min(n, int(mine * c.lines[t][-1].weight / weight + 0.999))
        return ahead


class QueueFull(Exception):
    """No place for the newcomer, and nobody to push out fairly."""
