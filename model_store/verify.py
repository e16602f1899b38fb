"""`verify DEST`: recheck every file of a complete model directory against its marker."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from model_store.errors import StoreError
from model_store.hashing import local_files, sha256_file
from model_store.marker import FileEntry, read_marker

Log = Callable[[str], None]


def _check(dest: Path, name: str, entry: FileEntry) -> str | None:
    """None if the file matches, else what is wrong with it."""
    path = dest / name
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return f"{path}: missing"
    except OSError as exc:
        return f"{path}: {exc.strerror}"
    if size != entry.size:
        return f"{path}: {size} bytes, the marker says {entry.size}"
    try:
        digest = sha256_file(path)
    except OSError as exc:
        return f"{path}: cannot read ({exc.strerror})"
    if digest != entry.sha256:
        return (
            f"{path}: SHA-256 mismatch (marker {entry.sha256[:12]}..., on disk {digest[:12]}...)"
        )
    return None


def verify(dest: Path, threads: int, log: Log) -> int:
    """Return the number of files checked; raise StoreError naming the first bad file."""
    if not dest.is_dir():
        raise StoreError(f"{dest} is not a directory")
    marker = read_marker(dest)
    if marker is None:
        raise StoreError(f"{dest} has no valid completion marker: it is not a complete model")
    items = sorted(marker.files.items())
    with ThreadPoolExecutor(max(1, min(threads, 4))) as pool:
        problems = [p for p in pool.map(lambda kv: _check(dest, *kv), items) if p is not None]
    extra = sorted(set(local_files(dest)) - set(marker.files))
    for name in extra:
        log(f"note: {dest / name} is not listed in the marker")
    if problems:
        more = f" (and {len(problems) - 1} more bad files)" if len(problems) > 1 else ""
        raise StoreError(problems[0] + more)
    total = sum(e.size for _, e in items)
    kind = (f", LoRA adapter of {marker.adapter.base_model} (rank {marker.adapter.rank})"
            if marker.adapter else "")
    log(f"{dest}: OK, {len(items)} files, {total / 1e6:,.1f} MB match the marker "
        f"({marker.source}{kind})")
    return len(items)
