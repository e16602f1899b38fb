"""SHA-256 of local files: the one integrity check shared by push, pull, verify and the demo."""

from __future__ import annotations

import hashlib
from pathlib import Path

from model_store.marker import MARKER_NAME, FileEntry


def sha256_file(path: Path) -> str:
    """Hex digest of `path`. hashlib.file_digest releases the GIL on its 256 KiB reads, so threads
    hash in parallel, as fast as a read loop of larger blocks (docs/benchmarks.md)."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def local_files(root: Path) -> list[str]:
    """Relative POSIX names of the regular files under `root` (symlinks followed), marker excluded."""
    return sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and p.name != MARKER_NAME
    )


def manifest_of(root: Path) -> dict[str, FileEntry]:
    """Size and SHA-256 of every file under `root` (the completion marker excluded)."""
    return {
        name: FileEntry(size=(root / name).stat().st_size, sha256=sha256_file(root / name))
        for name in local_files(root)
    }
