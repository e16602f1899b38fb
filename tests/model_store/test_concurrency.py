"""Many pullers, one download; kill -9 mid-download, then resume; stale leases are taken over."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from model_store.staging import lease_file, staging_dir
from tests.conftest import REPO, S3Env
from tests.model_store.conftest import PART, MiB, Pushed, assert_same_model

pytestmark = pytest.mark.s3
FAST_LEASE = {"MODEL_STORE_LEASE_POLL_S": "0.1", "MODEL_STORE_PART_SIZE": PART}


def _start(s3: S3Env, pushed: Pushed, dest: Path, **env: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "model_store", "pull", pushed.url, str(dest)],
        env=s3.env(**FAST_LEASE, **env), cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )


def test_eight_pullers_one_download(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    dest = tmp_path / "shared-volume" / "model" / "main"
    s3.counter.rate[pushed.bucket] = 20e6  # about a second of download: the others must wait
    try:
        procs = [_start(s3, pushed, dest) for _ in range(8)]
        results = [(p.wait(120), *p.communicate()) for p in procs]
    finally:
        s3.counter.rate.pop(pushed.bucket)
    for rc, out, err in results:
        assert rc == 0, err
        assert out.strip() == str(dest)
    assert_same_model(dest, pushed.local)
    sent = s3.counter.sent[pushed.bucket]
    assert pushed.size <= sent <= pushed.size + 5 * MiB, (sent, pushed.size)
    waited = [err for _, _, err in results if "pulled by another puller" in err]
    assert len(waited) >= 1  # at least one really waited on the lease rather than finding it done
    assert sorted(p.name for p in dest.parent.iterdir()) == ["main"]


def test_kill_9_mid_download_then_resume(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    total, bucket = pushed.size, pushed.bucket
    dest = tmp_path / "vol" / "m"
    s3.counter.rate[bucket] = 4e6
    try:
        # Concurrency 2 here, 8 on the restart: other range sizes, the same bytes kept.
        proc = _start(s3, pushed, dest, MODEL_STORE_CONCURRENCY="2")
        deadline = time.monotonic() + 60
        while s3.counter.sent[bucket] < 0.45 * total:
            assert proc.poll() is None and time.monotonic() < deadline, "pull ended too early"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
    finally:
        s3.counter.rate.pop(bucket)
    first = s3.counter.sent[bucket]
    assert first < total
    assert not dest.exists() and staging_dir(dest).is_dir()
    assert lease_file(dest).exists()  # the dead puller's lease is still there

    again = s3.cli("pull", pushed.url, dest, **FAST_LEASE)
    assert again.returncode == 0, again.stderr
    assert "is no longer running: taking over" in again.stderr
    assert "resuming:" in again.stderr
    assert_same_model(dest, pushed.local)
    second = s3.counter.sent[bucket] - first
    # Only what was not on disk: at most the bytes in flight when it died (< 1 MiB block per GET).
    assert total - first <= second <= total - first + 2 * MiB, (first, second, total)
    assert not lease_file(dest).exists() and not staging_dir(dest).exists()


def test_stale_lease_of_a_dead_puller_on_another_node_is_taken_over(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    dest = tmp_path / "m"
    lease_file(dest).write_text(json.dumps(
        {"host": "node-that-died", "boot_id": "b", "pid": 42, "start": "7", "token": "0" * 32}
    ))
    started = time.monotonic()
    proc = s3.cli("pull", pushed.url, dest, MODEL_STORE_LEASE_TTL_S="1.5",
                  MODEL_STORE_LEASE_HEARTBEAT_S="0.5", **FAST_LEASE)
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - started >= 1.5
    assert "pid 42 on node-that-died has not moved for 1.5s: taking over" in proc.stderr
    assert_same_model(dest, pushed.local)


def test_ctrl_c_exits_130_and_releases_the_lease(
    s3: S3Env, push_model: Callable[..., Pushed], tmp_path: Path
) -> None:
    pushed = push_model()
    dest = tmp_path / "m"
    # 1 MB/s per connection: the pull runs for seconds after the 2 MiB mark.
    s3.counter.rate[pushed.bucket] = 1e6
    try:
        proc = _start(s3, pushed, dest)
        deadline = time.monotonic() + 60
        while s3.counter.sent[pushed.bucket] < 2 * MiB:
            assert proc.poll() is None and time.monotonic() < deadline, "pull ended too early"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        s3.counter.rate.pop(pushed.bucket)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted; nothing was published" in err
    assert not dest.exists() and not lease_file(dest).exists()
    assert staging_dir(dest).is_dir()  # kept for the next pull to resume
