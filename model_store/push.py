"""`push LOCAL_DIR s3://bucket/prefix`: parallel multipart upload, the manifest object last.

Every file is hashed locally (SHA-256, threads beside the upload) and the manifest written only
after every object is complete, so a prefix with a manifest always holds a whole model and a
reader never trusts an ETag (multipart ETags are not MD5s). An existing manifest is removed first:
while a prefix is being overwritten it is "unfinished", never a mix of two uploads. Parts are read
with `pread` and sent from memory, so at most `concurrency` parts are buffered at once.

A LoRA adapter directory (adapter_config.json) is pushed the same way; its base model and rank go
into the manifest (model_store/adapter.py), checked before anything is uploaded.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from model_store.adapter import adapter_info
from model_store.client import check_bucket, make_client, translate
from model_store.errors import StoreError, UsageError
from model_store.hashing import local_files, sha256_file
from model_store.manifest import MANIFEST_NAME, Manifest, check_name, put_manifest
from model_store.marker import FileEntry
from model_store.progress import Progress, resolve_mode
from model_store.s3url import S3Url
from model_store.settings import StoreSettings

Log = Callable[[str], None]
HASH_THREADS = 2


def _files_of(local: Path) -> dict[str, int]:
    if not local.is_dir():
        raise UsageError(f"{local} is not a directory")
    # A link whose target is gone (say, a Hugging Face cache's missing blob) is no file to
    # local_files: skipped, the model would be published without it.
    broken = next((p for p in local.rglob("*") if p.is_symlink() and not p.exists()), None)
    if broken is not None:
        raise UsageError(f"{broken} is a broken symlink (to {os.readlink(broken)}): "
                         "the model would be pushed without it")
    names = local_files(local)
    if not names:
        raise UsageError(f"{local} holds no files to push")
    for name in names:
        check_name(name)  # the same rules pull applies: refuse what pull would refuse
    return {name: (local / name).stat().st_size for name in names}


def _call(client: Any, dst: S3Url, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
    try:
        return fn(Bucket=dst.bucket, **kwargs)
    except (BotoCoreError, ClientError) as exc:  # incl. connection and credential errors
        raise translate(exc, client, dst.bucket, what) from None


class _Uploader:
    def __init__(self, client: Any, dst: S3Url, local: Path, part_size: int, progress: Progress):
        self.client, self.dst, self.local = client, dst, local
        self.part_size, self.progress = part_size, progress
        self.uploads: dict[str, str] = {}  # key -> UploadId of multipart uploads not completed

    def call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        return _call(self.client, self.dst, what, fn, **kwargs)

    def read(self, name: str, start: int, size: int) -> bytes:
        fd = os.open(self.local / name, os.O_RDONLY)
        try:
            data = os.pread(fd, size, start)
        finally:
            os.close(fd)
        if len(data) != size:
            raise StoreError(f"{self.local / name} changed size while being pushed")
        return data

    def submit_file(self, pool: ThreadPoolExecutor, name: str, size: int) -> list[Future[Any]]:
        key, where = self.dst.key(name), f"{self.dst}/{name}"
        if size <= self.part_size:
            return [pool.submit(self._put_small, name, key, size)]
        upload = self.call(where, self.client.create_multipart_upload, Key=key)
        upload_id = self.uploads[key] = upload["UploadId"]
        etags: dict[int, str] = {}
        parts = [
            pool.submit(self._put_part, name, key, upload_id, n, start, size, etags)
            for n, start in enumerate(range(0, size, self.part_size), start=1)
        ]
        return [*parts, pool.submit(self._complete, name, key, upload_id, parts, etags)]

    def _put_small(self, name: str, key: str, size: int) -> None:
        body = self.read(name, 0, size)
        self.call(f"{self.dst}/{name}", self.client.put_object, Key=key, Body=body)
        self.progress.add(size)
        self.progress.file_done()

    def _put_part(
        self,
        name: str,
        key: str,
        upload_id: str,
        n: int,
        start: int,
        file_size: int,
        etags: dict[int, str],
    ) -> None:
        size = min(self.part_size, file_size - start)
        body = self.read(name, start, size)
        resp = self.call(
            f"{self.dst}/{name} part {n}", self.client.upload_part,
            Key=key, UploadId=upload_id, PartNumber=n, Body=body,
        )
        etags[n] = resp["ETag"]
        self.progress.add(size)

    def _complete(
        self, name: str, key: str, upload_id: str, parts: list[Future[Any]], etags: dict[int, str]
    ) -> None:
        for part in parts:
            part.result()  # the pool runs parts first (FIFO); a failed part fails the file
        self.call(
            f"{self.dst}/{name}", self.client.complete_multipart_upload,
            Key=key, UploadId=upload_id,
            MultipartUpload={"Parts": [{"PartNumber": n, "ETag": etags[n]} for n in sorted(etags)]},
        )
        self.uploads.pop(key, None)
        self.progress.file_done()

    def abort_all(self, log: Log) -> None:
        for key, upload_id in list(self.uploads.items()):
            try:
                self.client.abort_multipart_upload(
                    Bucket=self.dst.bucket, Key=key, UploadId=upload_id
                )
            except (BotoCoreError, ClientError) as exc:  # best effort: a lifecycle rule cleans up what is left
                log(f"could not abort the multipart upload of {key}: {exc}")


def push(
    settings: StoreSettings, local: Path, dst: S3Url, log: Log, base_model: str | None = None
) -> Manifest:
    if not dst.prefix:
        # Its manifest would make the whole bucket one model: `ls` would list its files, not the
        # bucket's other models, and a pull of any of them would see a stray manifest above.
        raise UsageError(
            f"push needs a prefix under the bucket, e.g. {dst}/MODEL/REVISION: a model at the "
            "bucket's root would hide the bucket's other models")
    sizes = _files_of(local)
    adapter = adapter_info(local, base_model)
    total = sum(sizes.values())
    client = make_client(settings)
    check_bucket(client, dst.bucket)
    # Unfinished from here on: a puller must not combine the old manifest with new objects.
    _call(client, dst, f"{dst}/{MANIFEST_NAME}", client.delete_object, Key=dst.key(MANIFEST_NAME))
    what = f"LoRA adapter of {adapter.base_model} (rank {adapter.rank}), " if adapter else ""
    log(f"pushing {what}{len(sizes)} files, {total / 1e6:,.1f} MB, to {dst}")
    progress = Progress(
        "push", total, len(sizes), mode=resolve_mode(settings.progress, sys.stderr),
        interval_s=settings.progress_interval_s,
    )
    up = _Uploader(client, dst, local, settings.part_size, progress)
    # Hashing runs beside the upload (hashlib releases the GIL on large blocks).
    with ThreadPoolExecutor(HASH_THREADS, thread_name_prefix="sha") as hashers, ThreadPoolExecutor(
        settings.concurrency, thread_name_prefix="put"
    ) as pool:
        digests = {name: hashers.submit(sha256_file, local / name) for name in sizes}
        futures: list[Future[Any]] = []
        try:
            for name, size in sorted(sizes.items()):
                futures += up.submit_file(pool, name, size)
            done, _ = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in done:
                if fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
        except BaseException:
            for fut in futures:
                fut.cancel()
            pool.shutdown(wait=True, cancel_futures=True)
            up.abort_all(log)
            raise
        finally:
            progress.close()
        files = {name: FileEntry(sizes[name], digests[name].result()) for name in sorted(sizes)}
    for name, entry in files.items():
        if (local / name).stat().st_size != entry.size:
            raise StoreError(f"{local / name} changed size while being pushed; push again")
    manifest = Manifest(files=files, adapter=adapter)
    put_manifest(client, dst, manifest)
    log(f"{dst}: complete ({total / 1e6:,.1f} MB, {len(files)} files, manifest written last)")
    return manifest
