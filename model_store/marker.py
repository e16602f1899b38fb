"""The completion marker: the one file that says a model directory is whole.

Every producer of a model directory (``bootstrap-demo``, the S3 puller) writes it last, after all
files are in place, and every consumer (the worker's wait, the Helm init container) trusts only it.
A directory without the marker may be half-written and must never be loaded.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from model_store.adapter import AdapterInfo
from model_store.errors import StoreError

MARKER_NAME = ".llmserve-complete.json"
MARKER_FORMAT = 1


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str


@dataclass(frozen=True)
class Marker:
    source: str
    files: dict[str, FileEntry]
    completed_at: float
    # A LoRA adapter's base and rank (model_store/adapter.py); None for a model.
    adapter: AdapterInfo | None = None

    def to_json(self) -> str:
        doc: dict[str, Any] = {
            "format": MARKER_FORMAT,
            "source": self.source,
            "completed_at": self.completed_at,
            "files": {
                name: {"size": e.size, "sha256": e.sha256}
                for name, e in sorted(self.files.items())
            },
        }
        if self.adapter is not None:
            doc["adapter"] = self.adapter.to_json()
        return json.dumps(doc, indent=2)


def marker_path(model_dir: str | os.PathLike[str]) -> Path:
    return Path(model_dir) / MARKER_NAME


def write_marker(
    model_dir: str | os.PathLike[str], source: str, files: dict[str, FileEntry],
    adapter: AdapterInfo | None = None,
) -> Marker:
    """Write the marker atomically (temp file + fsync + rename) so a reader never sees half of it."""
    marker = Marker(source=source, files=dict(files), completed_at=time.time(), adapter=adapter)
    final = marker_path(model_dir)
    tmp = final.with_name(final.name + f".tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(marker.to_json())
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    return marker


def read_marker(model_dir: str | os.PathLike[str]) -> Marker | None:
    """Return the marker, or None if the directory is not (yet) complete or the marker is garbage."""
    try:
        raw: Any = json.loads(marker_path(model_dir).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict) or raw.get("format") != MARKER_FORMAT:
        return None
    try:
        files = {
            str(name): FileEntry(size=int(e["size"]), sha256=str(e["sha256"]))
            for name, e in raw["files"].items()
        }
        adapter = (AdapterInfo.from_json(raw["adapter"], str(marker_path(model_dir)))
                    if "adapter" in raw else None)
        return Marker(source=str(raw["source"]), files=files,
                      completed_at=float(raw["completed_at"]), adapter=adapter)
    except (KeyError, TypeError, ValueError, AttributeError, StoreError):
        return None


def is_complete(model_dir: str | os.PathLike[str]) -> bool:
    return read_marker(model_dir) is not None
