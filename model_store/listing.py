"""`ls s3://bucket[/prefix]`: the models under a prefix, or the files of one model.

A model is a prefix that holds a manifest (push writes it last); objects without one are unfinished
or foreign uploads and are not listed as models.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from model_store.client import make_client, translate
from model_store.errors import StoreError
from model_store.manifest import MANIFEST_NAME, Manifest, fetch_manifest
from model_store.s3url import S3Url
from model_store.settings import StoreSettings


def _keys(client: Any, url: S3Url) -> Iterator[str]:
    prefix = f"{url.prefix}/" if url.prefix else ""
    try:
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=url.bucket, Prefix=prefix
        ):
            for obj in page.get("Contents", []):
                yield str(obj["Key"])
    except (BotoCoreError, ClientError) as exc:  # botocore's client, connection and credential errors
        raise translate(exc, client, url.bucket, f"the listing of {url}") from None


def model_prefixes(client: Any, url: S3Url) -> list[S3Url]:
    """Every prefix at or below `url` that holds a manifest."""
    found = []
    for key in _keys(client, url):
        head, _, name = key.rpartition("/")
        if name == MANIFEST_NAME:
            found.append(S3Url(url.bucket, head))
    return found


def _fmt(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def describe_model(url: S3Url, manifest: Manifest) -> list[str]:
    kind = (f", LoRA adapter of {manifest.adapter.base_model} (rank {manifest.adapter.rank})"
            if manifest.adapter else "")
    lines = [f"{url}: {len(manifest.files)} files, {_fmt(manifest.total_size)}{kind}"]
    width = max(len(n) for n in manifest.files)
    lines += [
        f"  {name:<{width}}  {entry.size:>15,}  {entry.sha256[:16]}"
        for name, entry in sorted(manifest.files.items())
    ]
    return lines


def ls(settings: StoreSettings, url: S3Url) -> list[str]:
    """The lines `ls` prints: one model's files if `url` is a model, else the models below it."""
    client = make_client(settings)
    models = model_prefixes(client, url)
    if any(m == url for m in models):
        return describe_model(url, fetch_manifest(client, url))
    if not models:
        raise StoreError(f"no models under {url} (no {MANIFEST_NAME} found)")
    lines = []
    for model in sorted(models, key=str):
        manifest = fetch_manifest(client, model)
        size, count = _fmt(manifest.total_size), len(manifest.files)
        kind = f"  adapter of {manifest.adapter.base_model}" if manifest.adapter else ""
        lines.append(f"{model!s:<60}  {size:>14}  {count:>4} files{kind}")
    return lines
