"""`pull s3://bucket/prefix DEST`: one puller per DEST, nothing visible until it is whole.

Order of events (each step is what makes the next one safe):
1. DEST already has the completion marker: done, no network at all.
2. Take the lease beside DEST, or wait until the holder's marker appears (waiters never talk to
   S3, so N pods starting together cost one download).
3. Read the manifest, see what the staging directory already holds (resume), check free space
   for the rest before the first GET of model data.
4. Fetch the missing parts into `.<dest>.partial/` on the same volume; verify each file.
5. Check we still hold the lease, rename the staging directory to DEST, write the marker last.

With `base_model` (a LoRA adapter's pull, `--base-model`) the manifest must name that base before
step 4, and a DEST already complete must carry it in its marker (model_store/adapter.py).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from model_store.adapter import check_base
from model_store.client import make_client
from model_store.download import Downloader
from model_store.errors import StoreError, UsageError
from model_store.lease import Lease, acquire
from model_store.manifest import Manifest, fetch_manifest
from model_store.marker import MARKER_NAME, is_complete, read_marker, write_marker
from model_store.progress import Progress, resolve_mode
from model_store.s3url import S3Url
from model_store.settings import StoreSettings, env_name
from model_store.staging import Plan, finish, lease_file, load_plan, prepare, staging_dir

Log = Callable[[str], None]


def default_dest(settings: StoreSettings, src: S3Url, model: str | None, revision: str | None) -> Path:
    """ROOT/<model>/<revision>/, the names defaulting to the prefix's last two segments."""
    if settings.root is None:
        raise UsageError(f"give DEST, or set {env_name('root')} (--root) for ROOT/<model>/<revision>")
    parts = src.prefix.split("/") if src.prefix else []
    revision = revision or (parts[-1] if len(parts) >= 2 else None)
    model = model or (parts[-2] if len(parts) >= 2 else None)
    if not model or not revision:
        raise UsageError(
            f"cannot tell model and revision from {src}: give DEST or --model and --revision"
        )
    for label, value in (("model", model), ("revision", revision)):
        if value in (".", "..") or "/" in value or value.startswith("."):
            raise UsageError(f"invalid {label} name {value!r}")
    return settings.root / model / revision


def _make_parents(path: Path) -> list[Path]:
    """mkdir -p, returning the directories this call created (to remove them on failure)."""
    missing: list[Path] = []
    for parent in [path, *path.parents]:
        if parent.exists():
            break
        missing.append(parent)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot create {path}: {exc.strerror}") from None
    return missing


def _remove_if_empty(dirs: list[Path]) -> None:
    for d in dirs:  # deepest first
        try:
            d.rmdir()
        except OSError:
            return


def _check_complete(dest: Path, base_model: str | None) -> None:
    """A DEST that is already complete: refuse it as the wrong base's adapter (its marker)."""
    marker = read_marker(dest)
    check_base(str(dest), marker.adapter if marker else None, base_model)


def pull(
    settings: StoreSettings, src: S3Url, dest: Path, log: Log, base_model: str | None = None
) -> Path:
    dest = Path(os.path.abspath(dest))
    if is_complete(dest):
        _check_complete(dest, base_model)
        log(f"{dest}: already complete")
        return dest
    created = _make_parents(dest.parent)
    published = False
    try:
        lease = acquire(
            lease_file(dest),
            ttl_s=settings.lease_ttl_s,
            heartbeat_s=settings.lease_heartbeat_s,
            poll_s=settings.lease_poll_s,
            timeout_s=settings.wait_timeout_s,
            done=lambda: is_complete(dest),
            log=log,
        )
        if lease is None:
            published = True
            _check_complete(dest, base_model)
            log(f"{dest}: complete (pulled by another puller)")
            return dest
        with lease:
            if is_complete(dest):  # finished by the previous holder just before we got in
                published = True
                _check_complete(dest, base_model)
                log(f"{dest}: already complete")
                return dest
            _pull_locked(settings, src, dest, lease, log, base_model)
            published = True
            return dest
    finally:
        if not published:
            _remove_if_empty(created)


def _pull_locked(
    settings: StoreSettings, src: S3Url, dest: Path, lease: Lease, log: Log,
    base_model: str | None,
) -> None:
    client = make_client(settings)
    manifest = fetch_manifest(client, src)
    check_base(str(src), manifest.adapter, base_model)  # before a byte of it is fetched
    staging = staging_dir(dest)
    if dest.exists() or dest.is_symlink():
        # A crash between the publishing rename and the marker leaves DEST without a marker;
        # take it back as staging: its files are checked against the manifest before reuse.
        _check_taken_back(dest, manifest)
        if staging.exists():
            raise StoreError(
                f"{dest} exists without a completion marker and so does {staging}: "
                "remove one of them"
            )
        log(f"{dest} has no completion marker: checking its files against the manifest")
        os.rename(dest, staging)
    fresh = not staging.exists()
    plan = load_plan(staging, manifest, range_size(manifest, settings), settings.concurrency)
    _check_space(dest.parent, plan, settings.free_space_margin)
    if plan.verified or any(f.present for f in plan.todo):
        log(
            f"resuming: {len(plan.verified)} files and {plan.bytes_on_disk / 1e6:,.1f} MB "
            f"already on disk, {plan.bytes_to_fetch / 1e6:,.1f} MB to fetch"
        )
    try:
        staging.mkdir(exist_ok=True)
        prepare(plan)
        _download(settings, client, src, plan, lease)
    except StoreError:
        if fresh and not plan_has_progress(plan):
            shutil.rmtree(staging, ignore_errors=True)
        raise
    lease.check()
    finish(plan)
    os.rename(staging, dest)
    write_marker(dest, source=str(src), files=manifest.files, adapter=manifest.adapter)
    log(f"{dest}: complete ({manifest.total_size / 1e6:,.1f} MB, {len(manifest.files)} files)")


def _check_taken_back(dest: Path, manifest: Manifest) -> None:
    """Refuse a DEST without a marker unless it holds nothing but files of this manifest and a
    marker being written (what a crash after the publishing rename leaves): anything else is the
    user's, and taking it back as staging would move it aside, then delete what the manifest
    does not list."""
    if not dest.is_dir():
        raise UsageError(f"DEST {dest} exists and is not a directory: give a model directory")
    parents = {p.as_posix() for name in manifest.files for p in Path(name).parents}
    for path in dest.rglob("*"):
        rel = path.relative_to(dest).as_posix()
        ours = (rel in parents and path.is_dir()) or (path.is_file() and (
            rel in manifest.files or rel.startswith(MARKER_NAME)))
        if path.is_symlink() or not ours:
            raise UsageError(
                f"DEST {dest} exists without a completion marker and holds {rel!r}, which the "
                "model does not list: not a model directory; remove it or give another DEST"
            )


def range_size(manifest: Manifest, settings: StoreSettings) -> int:
    """Bytes per ranged GET: `part_size` at least, larger while that still keeps `concurrency`
    requests busy. Fewer, larger GETs cost less per byte (a single-range file is also hashed as it
    streams, not read again), and resuming is by byte, not by range. Deterministic for a given
    manifest and settings, so a restarted pull keeps its progress."""
    share = -(-manifest.total_size // settings.concurrency)  # ceil
    return max(int(settings.part_size), share)


def plan_has_progress(plan: Plan) -> bool:
    return bool(plan.verified) or any(c.done for f in plan.todo for c in f.chunks)


def _check_space(volume: Path, plan: Plan, margin: int) -> None:
    need = plan.bytes_to_fetch + margin
    free = shutil.disk_usage(volume).free
    if free < need:
        raise StoreError(
            f"not enough free space on {volume}: {plan.bytes_to_fetch / 1e6:,.1f} MB to fetch "
            f"+ {margin / 1e6:,.1f} MB margin, {free / 1e6:,.1f} MB free"
        )


def _download(
    settings: StoreSettings, client: object, src: S3Url, plan: Plan, lease: Lease
) -> None:
    manifest: Manifest = plan.manifest
    progress = Progress(
        "pull",
        manifest.total_size,
        len(manifest.files),
        mode=resolve_mode(settings.progress, sys.stderr),
        interval_s=settings.progress_interval_s,
        done_bytes=plan.bytes_on_disk,
        done_files=len(plan.verified),
    )
    try:
        Downloader(
            client,
            src,
            plan,
            concurrency=settings.concurrency,
            max_attempts=settings.max_attempts,
            progress=progress,
            lease=lease,
        ).run()
    finally:
        progress.close()
