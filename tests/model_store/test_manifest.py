from __future__ import annotations

import json

import pytest

from model_store.errors import StoreError
from model_store.manifest import Manifest, check_name
from model_store.marker import FileEntry

DIGEST = "ab" * 32


@pytest.mark.parametrize("name", ["config.json", "sub/dir/x.bin", "a..b", ".hidden", "x/.y"])
def test_accepts_ordinary_names(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name",
    ["", "/etc/passwd", "../up", "a/../../b", "a//b", "./a", "a/", "a\\b", "a\0b",
     ".llmserve-complete.json", ".llmserve-manifest.json"],
)
def test_refuses_names_that_escape_or_clash(name: str) -> None:
    with pytest.raises(StoreError, match="refusing file name"):
        check_name(name)


def test_json_round_trip() -> None:
    m = Manifest({"a": FileEntry(3, DIGEST), "b/c": FileEntry(0, "cd" * 32)}, created_at=1.0)
    assert Manifest.from_json(m.to_json(), "x") == m
    assert m.total_size == 3


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({"format": 2, "files": {"a": {"size": 1, "sha256": DIGEST}}}, "unknown format"),
        ({"format": 1, "files": {}}, "no files"),
        ({"format": 1, "files": {"a": {"size": -1, "sha256": DIGEST}}}, "bad entry"),
        ({"format": 1, "files": {"a": {"size": 1, "sha256": "xyz"}}}, "bad entry"),
        ({"format": 1, "files": {"../a": {"size": 1, "sha256": DIGEST}}}, "refusing file name"),
        ({"format": 1}, "files"),
    ],
)
def test_refuses_bad_manifests(doc: object, fragment: str) -> None:
    with pytest.raises(StoreError) as err:
        Manifest.from_json(json.dumps(doc).encode(), "s3://b/m/.llmserve-manifest.json")
    assert fragment in str(err.value)


def test_refuses_non_json() -> None:
    with pytest.raises(StoreError, match="not a valid manifest"):
        Manifest.from_json(b"<html>", "where")
