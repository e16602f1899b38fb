"""Parallel ranged GETs into the staging directory, each file verified (size + SHA-256) on arrival.

Work units are parts of files (`part_size` bytes), ordered file by file so that files complete
early and few are open at once; `concurrency` threads fetch them. A part resumes from the bytes
already on disk (a `Range` that starts where it stopped), both after a crash (progress file) and
after a broken stream within this run. A single-part file fetched from byte 0 is hashed while it
streams; the others are hashed from disk by the thread that finishes their last part.

Why not boto3's s3transfer: doing the same job (all files on one TransferManager, the same parts
and threads, then SHA-256 and fsync per file) it was slower, measured side by side
(`python -m bench.pull_throughput`, docs/benchmarks.md), since it hashes in one thread after the
transfers; and it cannot resume a file at a byte offset, which a killed pull does (tested).
"""

from __future__ import annotations

import errno
import hashlib
import os
import threading
import time
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError
from urllib3.exceptions import HTTPError as Urllib3Error

from model_store.client import MISSING, error_code, translate
from model_store.errors import StoreError
from model_store.hashing import sha256_file
from model_store.lease import Lease
from model_store.progress import Progress
from model_store.s3url import S3Url
from model_store.staging import Chunk, FilePlan, Plan, pack_count, progress_offset, record_verified

BLOCK = 1 << 20
WRITEBACK_EVERY = 16 << 20
RETRY_BASE_S = 0.5


@dataclass
class _File:
    plan: FilePlan
    remaining: int
    fd: int = -1
    prog_fd: int = -1
    hasher: Any = None  # inline SHA-256, only for a single part fetched from byte 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class Downloader:
    def __init__(
        self,
        client: Any,
        src: S3Url,
        plan: Plan,
        *,
        concurrency: int,
        max_attempts: int,
        progress: Progress,
        lease: Lease | None,
    ) -> None:
        self.client, self.src, self.plan = client, src, plan
        self.concurrency, self.max_attempts = concurrency, max_attempts
        self.progress, self.lease = progress, lease
        self.stop = threading.Event()

    def run(self) -> None:
        files = [_File(fp, sum(c.done < c.size for c in fp.chunks)) for fp in self.plan.todo]
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="get") as pool:
            futures: list[Future[None]] = []
            for f in files:
                if f.remaining == 0:  # all bytes were on disk already: only the check is left
                    futures.append(pool.submit(self._verify, f))
                for c in f.plan.chunks:
                    if c.done < c.size:
                        futures.append(pool.submit(self._chunk, f, c))
            try:
                done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            except BaseException:  # Ctrl-C / SIGTERM: let the running parts stop at a block
                self.stop.set()
                for fut in futures:
                    fut.cancel()
                raise
            failed = [fut for fut in done if fut.exception() is not None]
            if failed:
                self.stop.set()
                for fut in pending:
                    fut.cancel()
                wait(pending)
                for f in files:
                    self._close(f)
                # The futures that failed first carry the cause; later ones only saw the stop.
                later = [fut for fut in futures if fut.done() and not fut.cancelled()]
                errors = [fut.exception() for fut in [*failed, *later]]
                real = [e for e in errors if e is not None and not isinstance(e, _Stopped)]
                raise real[0] if real else StoreError("download stopped")

    # -- one part --------------------------------------------------------------------------------
    def _chunk(self, f: _File, c: Chunk) -> None:
        name, entry = f.plan.name, f.plan.entry
        self._open(f, c)
        failures = 0
        while c.done < c.size:
            self._check_stop()
            whole = c.start == 0 and c.done == 0 and c.end == entry.size
            extra = {} if whole else {"Range": f"bytes={c.start + c.done}-{c.end - 1}"}
            resp = self._get(name, extra)
            try:
                self._check_size(name, entry.size, resp, whole)
                for block in resp["Body"].iter_chunks(BLOCK):
                    self._check_stop()
                    if c.done + len(block) > c.size:
                        raise StoreError(f"{name}: the server sent more bytes than asked for")
                    self._write(f, c, block)
            except (BotoCoreError, Urllib3Error, ConnectionError, TimeoutError) as exc:
                failures += 1
                if failures >= self.max_attempts:
                    raise StoreError(
                        f"{name}: download broke off {failures} times ({type(exc).__name__}); "
                        "run the pull again to resume"
                    ) from None
                time.sleep(RETRY_BASE_S * 2 ** (failures - 1))
            finally:
                resp["Body"].close()
        with f.lock:
            f.remaining -= 1
            last = f.remaining == 0
        if last:
            self._verify(f)

    def _get(self, name: str, extra: dict[str, str]) -> Any:
        where = f"{self.src}/{name}"
        try:
            return self.client.get_object(
                Bucket=self.src.bucket, Key=self.src.key(name), **extra
            )
        except ClientError as exc:
            code = error_code(exc)
            if code in MISSING:
                raise StoreError(f"{name}: listed in the manifest but {where} is missing") from None
            if code == "InvalidRange":
                raise StoreError(
                    f"{name}: {where} is shorter than the manifest says (changed after push)"
                ) from None
            raise translate(exc, self.client, self.src.bucket, where) from None
        except BotoCoreError as exc:
            raise translate(exc, self.client, self.src.bucket, where) from None

    def _check_size(self, name: str, size: int, resp: dict[str, Any], whole: bool) -> None:
        if whole:
            actual = int(resp["ContentLength"])
        else:
            actual = int(str(resp.get("ContentRange", "")).rpartition("/")[2] or -1)
        if actual != size:
            raise StoreError(
                f"{name}: {self.src}/{name} is {actual} bytes but the manifest says {size} "
                "(changed after push); nothing published"
            )

    def _check_stop(self) -> None:
        if self.lease is not None and self.lease.lost is not None:
            self.lease.check()
        if self.stop.is_set():
            raise _Stopped

    def _write(self, f: _File, c: Chunk, block: bytes) -> None:
        try:
            os.pwrite(f.fd, block, c.start + c.done)
            if f.hasher is not None:
                f.hasher.update(block)
            c.done += len(block)
            # Only after the data: a count never claims bytes that were not written.
            os.pwrite(f.prog_fd, pack_count(c.done), progress_offset(c))
            window = c.done // WRITEBACK_EVERY
            if window > (c.done - len(block)) // WRITEBACK_EVERY:
                # Start writing the last window to disk now (asynchronously): the fsync before a
                # file counts as verified then waits for little, instead of for the whole file.
                start = c.start + (window - 1) * WRITEBACK_EVERY
                os.posix_fadvise(f.fd, start, WRITEBACK_EVERY, os.POSIX_FADV_DONTNEED)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                raise StoreError(f"{f.plan.name}: the volume is full ({exc.strerror})") from None
            raise StoreError(f"{f.plan.name}: cannot write: {exc.strerror}") from None
        self.progress.add(len(block))

    # -- files -----------------------------------------------------------------------------------
    def _open(self, f: _File, c: Chunk) -> None:
        with f.lock:
            if f.fd >= 0:
                return
            part = self.plan.part_path(f.plan.name)
            f.fd = os.open(part, os.O_RDWR | os.O_CREAT, 0o644)
            f.prog_fd = os.open(self.plan.progress_path(f.plan.name), os.O_WRONLY)
            if len(f.plan.chunks) == 1 and c.done == 0:
                f.hasher = hashlib.sha256()

    def _close(self, f: _File) -> None:
        with f.lock:
            for fd in (f.fd, f.prog_fd):
                if fd >= 0:
                    os.close(fd)
            f.fd = f.prog_fd = -1

    def _verify(self, f: _File) -> None:
        name, entry = f.plan.name, f.plan.entry
        part = self.plan.part_path(name)
        if f.fd >= 0:
            os.fsync(f.fd)  # durable before it is called verified
        hasher = f.hasher
        self._close(f)
        if entry.size == 0:
            part.touch()
        size = part.stat().st_size
        digest = hasher.hexdigest() if hasher is not None else sha256_file(part)
        if size != entry.size or digest != entry.sha256:
            part.unlink(missing_ok=True)
            self.plan.progress_path(name).unlink(missing_ok=True)
            raise StoreError(
                f"{name}: SHA-256 mismatch (manifest {entry.sha256[:12]}..., downloaded "
                f"{digest[:12]}...): {self.src}/{name} changed after push; nothing published"
            )
        final = self.plan.staging / name
        final.parent.mkdir(parents=True, exist_ok=True)
        os.rename(part, final)
        record_verified(self.plan.staging, name, entry)
        self.plan.progress_path(name).unlink(missing_ok=True)
        self.progress.file_done()


class _Stopped(Exception):
    """Another part failed (or we were interrupted): this one stops quietly."""
