"""What a restarted pull reuses from its staging directory."""

from __future__ import annotations

import json
from pathlib import Path

from model_store.hashing import manifest_of
from model_store.manifest import Manifest
from model_store.staging import JOURNAL, load_plan
from tests.model_store.conftest import write_model


def test_a_torn_journal_costs_a_rehash_not_the_pull(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 in the journal (a write torn by a machine crash): the files it
    vouched for are hashed again and kept."""
    staging = write_model(tmp_path / ".m.partial", {"a.bin": 1000, "b.bin": 2000})
    files = manifest_of(staging)
    line = json.dumps({"name": "a.bin", "size": 1000, "sha256": files["a.bin"].sha256})
    (staging / JOURNAL).write_bytes(line.encode() + b"\n\xff\xfe\x00garbage\n")
    manifest = Manifest(files=files)
    plan = load_plan(staging, manifest, 1 << 20, 2)
    assert plan.verified == files and plan.todo == []
