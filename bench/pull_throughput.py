"""Pull throughput from a loopback S3 server: `model_store pull` vs a plain boto3 loop.

    .venv/bin/python -m bench.pull_throughput [--files 8] [--file-mb 128] [--repeats 3]

Builds a multi-file model of random bytes (default 8 x 128 MB = 1 GiB), pushes it with
`model_store push` to moto's S3 server on loopback (a subprocess), then, in each round and in
alternating order, pulls it with:

* `pull xN`: model_store's pull with its default settings (64 MiB ranged GETs, N in flight, each file
  checked against the manifest's SHA-256, staging + rename + marker);
* `download_file loop`: `for key in keys: client.download_file(...)`, boto3's defaults (s3transfer
  splits files above 8 MiB into 8 MiB ranged GETs over 10 threads, one file at a time; no
  integrity check);
* `single GET loop`: the same loop with multipart_threshold above the file size, i.e. one GET
  stream per file, one file at a time;
* `single GET + fsync`: that loop, each file fsync'ed after its download (pull makes every file
  durable before it counts as verified and before the marker).
* `s3transfer as pull`: the library doing pull's whole job: every file submitted at once to one
  s3transfer `TransferManager` with pull's part size and parallelism, each file then hashed
  (SHA-256) and fsync'ed.

`--pull-concurrency 8,2` runs pull at each of those in-flight counts.

MB/s = model bytes / wall time, medians over the rounds. Every run writes into a fresh directory
that is deleted afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig, create_transfer_manager
from botocore.config import Config

from devstack.cli import Parser
from devstack.procs import free_port
from model_store.pull import pull
from model_store.push import push
from model_store.s3url import S3Url
from model_store.settings import StoreSettings

BUCKET = "bench"
PREFIX = "model/main"


@contextmanager
def moto(log: Path) -> Iterator[str]:
    port = free_port()
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from moto.server import main; main()",
             "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=subprocess.STDOUT,
        )
    try:
        for _ in range(300):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def build_model(root: Path, files: int, file_mb: int) -> int:
    root.mkdir(parents=True)
    for i in range(files):
        (root / f"model-{i + 1:05d}-of-{files:05d}.safetensors").write_bytes(
            os.urandom(file_mb * 1_000_000)
        )
    (root / "config.json").write_text('{"bench": true}')
    return sum(p.stat().st_size for p in root.iterdir())


def timed(fn: Callable[[Path], Any], work: Path) -> float:
    dest = work / "dest"
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    started = time.perf_counter()
    fn(dest / "model")
    took = time.perf_counter() - started
    shutil.rmtree(dest)
    return took


def main() -> None:
    ap = Parser(prog="python -m bench.pull_throughput", description=__doc__.split("\n\n")[0])
    ap.add_argument("--files", type=int, default=8, help="files in the synthetic model")
    ap.add_argument("--file-mb", type=int, default=128, help="size of each file, MB")
    ap.add_argument("--repeats", type=int, default=3, help="timed pulls per concurrency")
    ap.add_argument("--pull-concurrency", default="8,2",
                    help="pull's in-flight GETs to run, comma-separated")
    args = ap.parse_args()
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench",
                      AWS_REGION="us-east-1", AWS_EC2_METADATA_DISABLED="true")
    with tempfile.TemporaryDirectory(prefix="pull-bench-") as tmp, moto(Path(tmp) / "moto.log") as url:
        work = Path(tmp)
        total = build_model(work / "local", args.files, args.file_mb)
        settings = StoreSettings(endpoint_url=url, path_style=True, progress="off")
        client = boto3.client("s3", endpoint_url=url,
                              config=Config(s3={"addressing_style": "path"},
                                            max_pool_connections=16))
        client.create_bucket(Bucket=BUCKET)
        src = S3Url(BUCKET, PREFIX)
        push(settings, work / "local", src, lambda _: None)
        keys = sorted(p.name for p in (work / "local").iterdir())
        single = TransferConfig(multipart_threshold=total + 1)

        # The library doing pull's whole job: s3transfer's ranged GETs in pull's part size and
        # parallelism, then each file hashed and made durable as pull does before its marker.
        like_pull = TransferConfig(multipart_threshold=settings.part_size,
                                   multipart_chunksize=settings.part_size,
                                   max_concurrency=settings.concurrency)

        def loop(config: TransferConfig | None, sync: bool = False) -> Callable[[Path], None]:
            def run(dest: Path) -> None:
                dest.mkdir()
                for k in keys:
                    kwargs = {"Config": config} if config else {}
                    client.download_file(BUCKET, src.key(k), str(dest / k), **kwargs)
                    if sync:  # durable, as pull's files are before its marker
                        fd = os.open(dest / k, os.O_RDONLY)
                        os.fsync(fd)
                        os.close(fd)
            return run

        def manager(dest: Path) -> None:
            # All files submitted to one TransferManager at once, so that its threads work across
            # files as pull's do; each file hashed and fsync'ed as its download completes.
            dest.mkdir()
            with create_transfer_manager(client, like_pull) as tm:
                futures = [(k, tm.download(BUCKET, src.key(k), str(dest / k))) for k in keys]
                for k, fut in futures:
                    fut.result()
                    with open(dest / k, "rb") as f:
                        hashlib.file_digest(f, "sha256")
                        os.fsync(f.fileno())

        runs: dict[str, Callable[[Path], Any]] = {}
        for n in (int(c) for c in args.pull_concurrency.split(",")):
            s = settings.model_copy(update={"concurrency": n})
            runs[f"pull x{n}"] = lambda dest, s=s: pull(s, src, dest, lambda _: None)
        runs |= {
            "download_file loop": loop(None),
            "single GET loop": loop(single),
            "single GET + fsync": loop(single, sync=True),
            "s3transfer as pull": manager,
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        order = list(runs)
        for r in range(args.repeats):
            for name in order if r % 2 == 0 else order[::-1]:
                times[name].append(timed(runs[name], work))
                print(f"round {r + 1} {name:<20} {total / times[name][-1] / 1e6:8.1f} MB/s",
                      flush=True)
    med = {name: statistics.median(t) for name, t in times.items()}
    print(f"\n{args.files} files, {total / 1e6:,.0f} MB, {os.cpu_count()} cores, "
          f"medians of {args.repeats}:")
    for name, t in med.items():
        print(f"  {name:<20} {total / t / 1e6:8.1f} MB/s  ({t:.2f} s)")
    first = next(iter(med))
    for name in ("download_file loop", "single GET loop", "single GET + fsync",
                 "s3transfer as pull"):
        print(f"  {first} / {name}: x{med[name] / med[first]:.2f}")

if __name__ == "__main__":
    main()
