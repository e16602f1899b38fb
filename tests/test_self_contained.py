"""The repository stands alone: no tracked file reads or cites a path outside its own tree.

A fresh clone has nothing beside it, so a test that reads `../shared/...` passes on a developer's
machine and fails everywhere else. Every `../` in a tracked text file is resolved from the file's
own directory; it must land inside the repository on something that exists. The few strings that
are deliberately bad paths (path-traversal test inputs) are listed below, file by file.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_PARENT_REF = re.compile(r"(?:\.\./)+[A-Za-z0-9_.\-/]*")
# Absolute paths of this workplace's shared folders: a clone elsewhere has none of them.
_ABSOLUTE = re.compile(r"/work/(?:shared|\.library|wt)\b")

# Test inputs that are path traversals on purpose (the code under test must refuse them).
TRAVERSAL_INPUTS: dict[str, set[str]] = {
    "tests/deploy/test_render.py": {"../etc"},
    "tests/model_store/test_manifest.py": {"../up", "../../b", "../a"},
}
# This file: its strings are the checker's own test data.
SELF = "tests/test_self_contained.py"


def outside_references(rel: str, text: str, root: Path = REPO) -> list[str]:
    """The references in `text` (the content of `rel`) that leave `root` or lead nowhere."""
    found: list[str] = []
    base = (root / rel).parent
    allowed = TRAVERSAL_INPUTS.get(rel, set())
    for m in _PARENT_REF.finditer(text):
        ref = m.group(0)
        if ref in allowed:
            continue
        target = Path(os.path.normpath(base / ref))
        if not target.is_relative_to(root) or not target.exists():
            found.append(ref)
    found += [m.group(0) for m in _ABSOLUTE.finditer(text)]
    return found


def _tracked_text_files() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def test_no_tracked_file_refers_outside_the_repository() -> None:
    files = _tracked_text_files()
    assert len(files) > 100  # the control: git listed the tree
    bad: dict[str, list[str]] = {}
    for rel in files:
        if rel == SELF:
            continue
        data = (REPO / rel).read_bytes()
        if b"\0" in data[:4096]:
            continue  # binary
        refs = outside_references(rel, data.decode("utf-8", "replace"))
        if refs:
            bad[rel] = refs
    assert bad == {}, f"paths outside the repository: {bad}"


def test_the_check_catches_what_it_is_for(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("x")
    assert outside_references("Makefile", "see ../shared/notes/x.md", tmp_path) == [
        "../shared/notes/x.md"
    ]
    assert outside_references("docs/b.md", "read /work/shared/y", tmp_path) == ["/work/shared"]
    # Inside the tree and present: fine. Inside but missing: a dangling reference.
    assert outside_references("docs/sub/c.md", "see ../a.md", tmp_path) == []
    assert outside_references("docs/b.md", "see ../nothere.md", tmp_path) == ["../nothere.md"]
