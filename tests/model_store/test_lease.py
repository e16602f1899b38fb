"""The lease: one winner, live holders are never taken over, dead ones are (TTL or local pid)."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest

from model_store.errors import LeaseLost, StoreError
from model_store.lease import Owner, acquire, read_owner, try_create

FAST = {"ttl_s": 0.6, "heartbeat_s": 0.1, "poll_s": 0.05}


def _acquire(path: Path, timeout_s: float = 0.0, done: bool = False):  # type: ignore[no-untyped-def]
    return acquire(path, timeout_s=timeout_s, done=lambda: done, log=lambda _: None, **FAST)


def _foreign(path: Path, **changes: object) -> None:
    doc = {"host": "other-node", "boot_id": "x", "pid": 1, "start": "1", "token": "t" * 32,
           "created_at": time.time(), **changes}
    path.write_text(json.dumps(doc))


def test_first_wins_and_release_removes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    lease = _acquire(path)
    assert lease is not None and read_owner(path) == lease.owner
    lease.release()
    assert not path.exists()


def test_live_holder_is_not_taken_over(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    with _acquire(path) as held:
        started = time.monotonic()
        with pytest.raises(StoreError, match="gave up after 1.5s waiting for pid"):
            _acquire(path, timeout_s=1.5)  # 2.5 TTLs: the heartbeat keeps it fresh
        assert time.monotonic() - started >= 1.5
        held.check()  # still ours


def test_waiter_returns_when_the_model_is_done(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    _foreign(path)
    assert _acquire(path, done=True) is None


def test_stale_foreign_lease_is_taken_over_after_the_ttl(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    _foreign(path)  # another node's puller that died: its heartbeat never moves again
    started = time.monotonic()
    lease = _acquire(path, timeout_s=10)
    took = time.monotonic() - started
    assert lease is not None and read_owner(path) == lease.owner
    assert FAST["ttl_s"] <= took < 5
    lease.release()


def test_dead_local_pid_is_taken_over_at_once(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    me = Owner.me()
    # Same host and boot, but a process start time that no running process has.
    _foreign(path, host=me.host, boot_id=me.boot_id, pid=os.getpid(), start="0")
    started = time.monotonic()
    lease = _acquire(path, timeout_s=10)
    assert lease is not None and time.monotonic() - started < FAST["ttl_s"]
    lease.release()


def test_holder_that_lost_its_lease_notices(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    lease = _acquire(path)
    assert lease is not None
    path.unlink()
    _foreign(path)  # somebody presumed us dead and took over
    with pytest.raises(LeaseLost, match="pid 1 on other-node"):
        lease.check()
    lease.release()
    assert path.exists()  # not ours: release leaves it alone


def test_exactly_one_of_many_threads_wins(tmp_path: Path) -> None:
    path = tmp_path / "m.lease"
    winners: list[bool] = []
    barrier = threading.Barrier(8)

    def race() -> None:
        barrier.wait()
        if try_create(path, Owner.me()):
            winners.append(True)

    threads = [threading.Thread(target=race) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(winners) == 1
