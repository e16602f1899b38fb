from __future__ import annotations

import pytest

from model_store.errors import StoreError
from model_store.s3url import S3Url


@pytest.mark.parametrize(
    ("text", "bucket", "prefix"),
    [
        ("s3://models", "models", ""),
        ("s3://models/", "models", ""),
        ("s3://models/llama/main", "models", "llama/main"),
        ("s3://my.bucket-1/a/b/", "my.bucket-1", "a/b"),
    ],
)
def test_parses(text: str, bucket: str, prefix: str) -> None:
    url = S3Url.parse(text)
    assert (url.bucket, url.prefix) == (bucket, prefix)
    assert S3Url.parse(str(url)) == url


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("models/llama", "not an s3://"),
        ("https://models/llama", "not an s3://"),
        ("s3://", "not a valid bucket"),
        ("s3://Models/x", "not a valid bucket"),
        ("s3://ab/x", "not a valid bucket"),
        ("s3://models/a//b", "empty path segment"),
    ],
)
def test_refuses(text: str, fragment: str) -> None:
    with pytest.raises(StoreError, match=fragment):
        S3Url.parse(text)


def test_keys_and_children() -> None:
    root, model = S3Url.parse("s3://models"), S3Url.parse("s3://models/llama/main")
    assert root.key("x.json") == "x.json"
    assert model.key("sub/x.json") == "llama/main/sub/x.json"
    assert root.child("/llama/").prefix == "llama"
