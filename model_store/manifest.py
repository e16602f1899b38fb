"""The manifest object: what `push` promises is under a prefix, file by file (size + SHA-256).

Multipart ETags are not MD5s of the content, so they cannot be the check; the manifest is. `push`
writes it last, so a prefix without a manifest is an unfinished (or foreign) upload and `pull`
refuses it. Names are validated before any of them becomes a local path: a manifest must not be
able to write outside the destination.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from model_store.adapter import AdapterInfo
from model_store.client import MISSING, error_code, translate
from model_store.errors import StoreError
from model_store.marker import MARKER_NAME, FileEntry
from model_store.s3url import S3Url

MANIFEST_NAME = ".llmserve-manifest.json"
MANIFEST_FORMAT = 1
# Top-level names of our own bookkeeping (the marker, the manifest, the partial downloads).
RESERVED_PREFIX = ".llmserve-"
assert MARKER_NAME.startswith(RESERVED_PREFIX) and MANIFEST_NAME.startswith(RESERVED_PREFIX)
_HEX = frozenset("0123456789abcdef")


def check_name(name: str) -> str:
    """Refuse names that would escape the model directory or clash with our own files."""
    path = PurePosixPath(name)
    if (
        not name
        or path.is_absolute()
        or any(part in ("", ".", "..") for part in name.split("/"))
        or "\\" in name
        or "\0" in name
        or name.startswith(RESERVED_PREFIX)
    ):
        raise StoreError(f"refusing file name {name!r} in the manifest")
    return name


@dataclass(frozen=True)
class Manifest:
    files: dict[str, FileEntry]
    created_at: float = field(default_factory=time.time)
    # Set when the prefix holds a LoRA adapter: its base model and rank (model_store/adapter.py).
    adapter: AdapterInfo | None = None

    @property
    def total_size(self) -> int:
        return sum(e.size for e in self.files.values())

    def to_json(self) -> bytes:
        doc: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "created_at": self.created_at,
            "files": {
                n: {"size": e.size, "sha256": e.sha256} for n, e in sorted(self.files.items())
            },
        }
        if self.adapter is not None:
            doc["adapter"] = self.adapter.to_json()
        return json.dumps(doc, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes, where: str) -> Manifest:
        try:
            doc: Any = json.loads(raw)
            if doc.get("format") != MANIFEST_FORMAT:
                raise ValueError(f"unknown format {doc.get('format')!r}")
            files: dict[str, FileEntry] = {}
            for name, e in doc["files"].items():
                size, digest = int(e["size"]), str(e["sha256"]).lower()
                if size < 0 or len(digest) != 64 or not set(digest) <= _HEX:
                    raise ValueError(f"bad entry for {name!r}")
                files[check_name(str(name))] = FileEntry(size=size, sha256=digest)
            if not files:
                raise ValueError("no files")
            adapter = AdapterInfo.from_json(doc["adapter"], where) if "adapter" in doc else None
            return cls(files=files, created_at=float(doc.get("created_at", 0.0)), adapter=adapter)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise StoreError(f"{where} is not a valid manifest: {exc}") from None


def manifest_url(url: S3Url) -> str:
    return f"{url}/{MANIFEST_NAME}" if url.prefix else f"s3://{url.bucket}/{MANIFEST_NAME}"


def fetch_manifest(client: Any, url: S3Url) -> Manifest:
    where = manifest_url(url)
    try:
        raw = client.get_object(Bucket=url.bucket, Key=url.key(MANIFEST_NAME))["Body"].read()
    except ClientError as exc:
        if error_code(exc) in MISSING:
            raise StoreError(
                f"no model at {url}: {where} not found (upload with `llmserve-model-store push`)"
            ) from None
        raise translate(exc, client, url.bucket, where) from None
    except BotoCoreError as exc:  # botocore's connection and credential errors
        raise translate(exc, client, url.bucket, where) from None
    return Manifest.from_json(raw, where)


def put_manifest(client: Any, url: S3Url, manifest: Manifest) -> None:
    try:
        client.put_object(
            Bucket=url.bucket,
            Key=url.key(MANIFEST_NAME),
            Body=manifest.to_json(),
            ContentType="application/json",
        )
    except (BotoCoreError, ClientError) as exc:
        raise translate(exc, client, url.bucket, manifest_url(url)) from None
