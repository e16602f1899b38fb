"""One puller per destination: a lease file on the shared volume.

Why not flock/fcntl: on several NFS-type volumes (NFS without a lock manager, some CSI drivers,
FUSE file systems) a lock call silently "succeeds" on every client, so two pods would both believe
they own the download. Creating a file with O_CREAT|O_EXCL is atomic on every POSIX file system and
on NFSv3+ (the server decides), so exactly one creator wins. A plain file also survives its
owner's death, which is why it carries an owner and a heartbeat and can be taken over:

* the holder bumps the file's mtime every `heartbeat_s` and re-reads the file to make sure it is
  still its own (a holder presumed dead that wakes up must stop, not publish);
* a waiter never compares the heartbeat with its own wall clock (nodes' clocks differ): it watches
  the file and calls it expired once its identity (inode, mtime, size) has not changed for `ttl_s`
  on the waiter's own monotonic clock;
* an owner on this very machine (same host and boot id) whose process is gone, or was replaced by
  another process with the same pid, is expired at once: a restarted puller does not wait a TTL
  for itself;
* breaking a lease is itself guarded by an O_EXCL "breaker" file and an identity re-check, so two
  waiters cannot both remove a stale lease and then delete each other's fresh one.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from model_store.errors import LeaseLost, StoreError

Log = Callable[[str], None]
Identity = tuple[int, int, int]
WAIT_LOG_EVERY_S = 30.0


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot, or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces, so count from its closing paren.
    return stat.rsplit(")", 1)[1].split()[19]


@dataclass(frozen=True)
class Owner:
    host: str
    boot_id: str
    pid: int
    start: str
    token: str

    @classmethod
    def me(cls) -> Owner:
        pid = os.getpid()
        return cls(socket.gethostname(), _boot_id(), pid, _process_start(pid) or "", uuid.uuid4().hex)

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def to_json(self) -> bytes:
        return json.dumps({**asdict(self), "created_at": time.time()}).encode()

    def is_gone_locally(self) -> bool:
        """True only when we can prove it: same machine, same boot, the process is not there."""
        if self.host != socket.gethostname() or not self.boot_id or self.boot_id != _boot_id():
            return False
        return _process_start(self.pid) != self.start


def read_owner(path: Path) -> Owner | None:
    try:
        doc = json.loads(path.read_bytes())
        return Owner(
            str(doc["host"]), str(doc["boot_id"]), int(doc["pid"]), str(doc["start"]),
            str(doc["token"]),
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None  # gone, or a creator died between O_EXCL and its write: the TTL handles it


def identity(path: Path) -> Identity | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)


def try_create(path: Path, owner: Owner) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, owner.to_json())
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


class _Watch:
    """Staleness by observation: unchanged identity for `ttl_s` of our own monotonic time."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.seen: Identity | None = None
        self.since = 0.0

    def stale(self, ident: Identity) -> bool:
        now = time.monotonic()
        if ident != self.seen:
            self.seen, self.since = ident, now
            return False
        return now - self.since >= self.ttl_s


class Lease:
    """A held lease: heartbeats in a thread until released."""

    def __init__(self, path: Path, owner: Owner, heartbeat_s: float, log: Log) -> None:
        self.path, self.owner, self.log = path, owner, log
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._beat, args=(heartbeat_s,), name="lease-heartbeat", daemon=True
        )
        self._thread.start()

    def _beat(self, every: float) -> None:
        while not self._stop.wait(every):
            holder = read_owner(self.path)
            if holder is None or holder.token != self.owner.token:
                self.lost = holder.describe() if holder else "nobody (the lease file is gone)"
                return
            now = time.time_ns()
            try:
                os.utime(self.path, ns=(now, now))
            except FileNotFoundError:
                self.lost = "nobody (the lease file is gone)"
                return
            except OSError as exc:  # one failed beat is survivable: the TTL allows three
                self.log(f"lease heartbeat failed: {exc}")

    def check(self) -> None:
        """Raise LeaseLost if another puller has taken the lease over (checked on disk now)."""
        if self.lost is None:
            holder = read_owner(self.path)
            if holder is None or holder.token != self.owner.token:
                self.lost = holder.describe() if holder else "nobody (the lease file is gone)"
        if self.lost is not None:
            raise LeaseLost(
                f"lost the lease {self.path} to {self.lost} (this puller was presumed dead); "
                "nothing published by this process"
            )

    def release(self) -> None:
        self._stop.set()
        self._thread.join()
        holder = read_owner(self.path)
        if holder is not None and holder.token == self.owner.token:
            self.path.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()


def _break(path: Path, stale: Identity, owner: Owner, breaker_watch: _Watch) -> None:
    """Remove `path` if it still is the stale file we observed; one breaker at a time."""
    breaker = path.with_name(path.name + ".break")
    if not try_create(breaker, owner):
        ident = identity(breaker)
        # A breaker only lives for two syscalls; one unchanged for a TTL belongs to a dead process.
        if ident is not None and breaker_watch.stale(ident):
            breaker.unlink(missing_ok=True)
        return
    try:
        if identity(path) == stale:
            path.unlink(missing_ok=True)
    finally:
        breaker.unlink(missing_ok=True)


def acquire(
    path: Path,
    *,
    ttl_s: float,
    heartbeat_s: float,
    poll_s: float,
    timeout_s: float,
    done: Callable[[], bool],
    log: Log,
) -> Lease | None:
    """Hold the lease (returned), or wait until `done()` says another puller finished (None)."""
    me = Owner.me()
    watch, breaker_watch = _Watch(ttl_s), _Watch(ttl_s)
    started = time.monotonic()
    logged_at: float | None = None
    while True:
        if done():
            return None
        if try_create(path, me):
            return Lease(path, me, heartbeat_s, log)
        before = identity(path)
        holder = read_owner(path)
        if before is None or identity(path) != before:
            continue  # released or replaced while we looked: look again at once
        who = holder.describe() if holder else "an unknown owner"
        if holder is not None and holder.is_gone_locally():
            log(f"lease {path.name} belongs to {who}, which is no longer running: taking over")
            _break(path, before, me, breaker_watch)
            continue
        if watch.stale(before):
            log(f"lease {path.name} of {who} has not moved for {ttl_s:g}s: taking over")
            _break(path, before, me, breaker_watch)
            continue
        now = time.monotonic()
        if timeout_s and now - started >= timeout_s:
            raise StoreError(
                f"gave up after {timeout_s:g}s waiting for {who} (lease {path}) to finish"
            )
        if logged_at is None or now - logged_at >= WAIT_LOG_EVERY_S:
            log(f"another puller ({who}) holds {path.name}; waiting for it to finish")
            logged_at = now
        time.sleep(poll_s)
