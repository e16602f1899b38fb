from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from model_store.errors import StoreError
from model_store.s3url import URL, URL_UNDER, S3Url


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


# Strings made of the parts that matter to the rules: bucket characters, slashes, what is not
# allowed in a bucket.
_PART = st.sampled_from(["s3://", "ab", "a", "b.c", "-", ".", "/", "//", "A", "_", "x y", "9"])


@settings(max_examples=500, deadline=None)
@given(st.lists(_PART, max_size=8).map("".join))
def test_the_patterns_the_chart_takes_are_what_parse_accepts(text: str) -> None:
    """URL and URL_UNDER are what the chart's values schema uses for sources and adapters
    (deploy/helm/values_schema.py): the same verdict as parse, on every string."""
    try:
        url: S3Url | None = S3Url.parse(text)
    except StoreError:
        url = None
    assert (re.match(URL, text) is not None) == (url is not None), text
    assert (re.match(URL_UNDER, text) is not None) == (url is not None and url.prefix != ""), text
