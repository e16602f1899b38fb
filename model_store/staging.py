"""The staging directory beside DEST, and what a (re)started pull can reuse from it.

Layout of ``.<dest>.partial/`` (same volume as DEST, so publishing is one rename):

* ``<name>``: a file that was downloaded *and* matched the manifest's size and SHA-256;
* ``.llmserve-verified.jsonl``: one line per such file (name, size, sha256), so a restart trusts
  it without reading it again;
* ``.llmserve-parts/<name>``: a file being downloaded, written at offsets (one range per part);
* ``.llmserve-progress/<name>``: how many bytes of each part are on disk. The header holds the
  expected SHA-256 and the part size, so a changed manifest or part size discards stale progress.
  A count is written only after its bytes (pwrite order), so after a crash of the process it
  never claims bytes that are not there; a machine crash that loses page cache is caught by the
  final SHA-256 and that file is fetched again.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from model_store.hashing import sha256_file
from model_store.manifest import Manifest
from model_store.marker import FileEntry

JOURNAL = ".llmserve-verified.jsonl"
PARTS = ".llmserve-parts"
PROGRESS = ".llmserve-progress"
_HEADER = struct.Struct("<64sQ")  # sha256 hex, part size
_COUNT = struct.Struct("<Q")


def staging_dir(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.partial"


def lease_file(dest: Path) -> Path:
    return dest.parent / f".{dest.name}.lease"


@dataclass
class Chunk:
    index: int
    start: int
    end: int  # exclusive
    done: int = 0  # bytes of this chunk already on disk

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclass
class FilePlan:
    name: str
    entry: FileEntry
    part_size: int  # the range size of this file's chunks (kept across restarts)
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def present(self) -> int:
        return sum(c.done for c in self.chunks)


@dataclass
class Plan:
    staging: Path
    manifest: Manifest
    part_size: int
    verified: dict[str, FileEntry]  # already complete in staging
    todo: list[FilePlan]

    @property
    def bytes_on_disk(self) -> int:
        return sum(e.size for e in self.verified.values()) + sum(f.present for f in self.todo)

    @property
    def bytes_to_fetch(self) -> int:
        return self.manifest.total_size - self.bytes_on_disk

    def part_path(self, name: str) -> Path:
        return self.staging / PARTS / name

    def progress_path(self, name: str) -> Path:
        return self.staging / PROGRESS / name


def chunks_for(size: int, part_size: int) -> list[Chunk]:
    if size == 0:
        return [Chunk(0, 0, 0)]
    return [
        Chunk(i, start, min(start + part_size, size))
        for i, start in enumerate(range(0, size, part_size))
    ]


def _read_journal(staging: Path) -> dict[str, FileEntry]:
    entries: dict[str, FileEntry] = {}
    try:
        # Undecodable bytes (a torn write) make that line fail to parse, not the pull.
        lines = (staging / JOURNAL).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return entries
    for line in lines:
        try:
            doc = json.loads(line)
            entries[str(doc["name"])] = FileEntry(int(doc["size"]), str(doc["sha256"]))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line after a crash: that file is simply checked again
    return entries


def record_verified(staging: Path, name: str, entry: FileEntry) -> None:
    line = json.dumps({"name": name, "size": entry.size, "sha256": entry.sha256}) + "\n"
    fd = os.open(staging / JOURNAL, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _load_progress(plan_file: FilePlan, path: Path) -> bool:
    """Fill the chunks' `done` from the progress file; False if it is absent or stale.

    The ranges are the ones the progress file was written with (its header), whatever the range
    size of this run: a restart with other settings keeps the bytes already on disk."""
    try:
        raw = path.read_bytes()
    except OSError:
        return False
    if len(raw) < _HEADER.size:
        return False
    digest, psize = _HEADER.unpack_from(raw)
    if digest.decode("ascii", "replace") != plan_file.entry.sha256 or psize < 1:
        return False
    chunks = chunks_for(plan_file.entry.size, psize)
    if len(raw) != _HEADER.size + len(chunks) * _COUNT.size:
        return False
    plan_file.part_size, plan_file.chunks = psize, chunks
    for c in plan_file.chunks:
        (done,) = _COUNT.unpack_from(raw, _HEADER.size + c.index * _COUNT.size)
        c.done = min(done, c.size)
    return True


def load_plan(staging: Path, manifest: Manifest, part_size: int, threads: int) -> Plan:
    """What is already there (verified files, partial files) and what is left. Reads only."""
    journal = _read_journal(staging)
    verified: dict[str, FileEntry] = {}
    unsure: list[str] = []
    todo: list[FilePlan] = []
    for name, entry in sorted(manifest.files.items()):
        final = staging / name
        if final.is_file() and final.stat().st_size == entry.size:
            if journal.get(name) == entry:
                verified[name] = entry
            else:
                unsure.append(name)  # e.g. a DEST renamed back after a crash before its marker
            continue
        fp = FilePlan(name, entry, part_size=part_size)
        part = staging / PARTS / name
        if not (part.is_file() and _load_progress(fp, staging / PROGRESS / name)):
            fp.part_size, fp.chunks = part_size, chunks_for(entry.size, part_size)
        todo.append(fp)
    # Files of the right size that nobody vouched for: hash them (local reads beat a re-download).
    with ThreadPoolExecutor(max(1, threads)) as pool:
        digests = dict(zip(unsure, pool.map(lambda n: sha256_file(staging / n), unsure)))
    for name in unsure:
        entry = manifest.files[name]
        if digests[name] == entry.sha256:
            verified[name] = entry
        else:
            todo.append(FilePlan(name, entry, part_size, chunks_for(entry.size, part_size)))
    todo.sort(key=lambda f: f.name)
    return Plan(staging, manifest, part_size, verified, todo)


def prepare(plan: Plan) -> None:
    """Create the bookkeeping and reset stale partial files before the first byte is written."""
    (plan.staging / PARTS).mkdir(parents=True, exist_ok=True)
    (plan.staging / PROGRESS).mkdir(parents=True, exist_ok=True)
    journal = _read_journal(plan.staging)
    for name, entry in plan.verified.items():
        if journal.get(name) != entry:
            record_verified(plan.staging, name, entry)
    for fp in plan.todo:
        part, prog = plan.part_path(fp.name), plan.progress_path(fp.name)
        part.parent.mkdir(parents=True, exist_ok=True)
        prog.parent.mkdir(parents=True, exist_ok=True)
        (plan.staging / fp.name).unlink(missing_ok=True)  # a wrong-sized or corrupt leftover
        if fp.present == 0:
            part.unlink(missing_ok=True)
            fp.chunks = chunks_for(fp.entry.size, fp.part_size)  # nothing on disk: start clean
            header = _HEADER.pack(fp.entry.sha256.encode(), fp.part_size)
            prog.write_bytes(header + bytes(_COUNT.size * len(fp.chunks)))


def progress_offset(chunk: Chunk) -> int:
    return _HEADER.size + chunk.index * _COUNT.size


def pack_count(done: int) -> bytes:
    return _COUNT.pack(done)


def finish(plan: Plan) -> None:
    """Drop the bookkeeping and anything the manifest does not list, so DEST == manifest."""
    shutil.rmtree(plan.staging / PARTS, ignore_errors=True)
    shutil.rmtree(plan.staging / PROGRESS, ignore_errors=True)
    (plan.staging / JOURNAL).unlink(missing_ok=True)
    for path in sorted(plan.staging.rglob("*"), reverse=True):
        rel = path.relative_to(plan.staging).as_posix()
        if path.is_file() and rel not in plan.manifest.files:
            path.unlink()
        elif path.is_dir() and not any(path.iterdir()):
            path.rmdir()
