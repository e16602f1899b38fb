"""Bytes, files, rate and ETA of a push or pull, through tqdm: a bar on a terminal, log lines
otherwise (Job logs, CI), nothing with `--progress off`.

tqdm draws the bar and formats every figure (sizes, rate, ETA). A redrawn bar is unreadable in
a log, so `log` mode prints a plain line with tqdm's formatting every `interval_s` instead.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from tqdm import tqdm

BAR_REDRAW_S = 0.1


def resolve_mode(setting: str, stream: TextIO) -> str:
    if setting == "auto":
        return "bar" if stream.isatty() else "log"
    return setting


class Progress:
    """Thread-safe counters; `add` is called from every download/upload thread."""

    def __init__(
        self,
        verb: str,
        total_bytes: int,
        total_files: int,
        *,
        mode: str,
        interval_s: float,
        stream: TextIO = sys.stderr,
        done_bytes: int = 0,
        done_files: int = 0,
    ) -> None:
        self.verb, self.mode, self.interval_s, self.stream = verb, mode, interval_s, stream
        self.total_files = total_files
        self.files = done_files
        self._lock = threading.Lock()
        self._shown = time.monotonic()
        # Bytes already on disk (a resumed pull) count toward the total, not toward the rate.
        self._bar = tqdm(
            total=total_bytes, initial=done_bytes, desc=verb, unit="B", unit_scale=True,
            unit_divisor=1000, file=stream, mininterval=BAR_REDRAW_S, miniters=1,
            disable=mode != "bar", dynamic_ncols=True, leave=True,
            postfix=self._files(),
        )
        self._reused = done_bytes
        self._bytes = done_bytes
        self._start = time.monotonic()

    @property
    def bytes(self) -> int:
        return self._bytes

    def _files(self) -> str:
        return f"{self.files}/{self.total_files} files"

    def add(self, n: int) -> None:
        with self._lock:
            self._bytes += n
            self._bar.update(n)
            self._maybe_log()

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            self._bar.set_postfix_str(self._files(), refresh=False)
            self._maybe_log()

    def close(self) -> None:
        with self._lock:
            self._bar.set_postfix_str(self._files(), refresh=True)
            self._bar.close()
            if self.mode == "log":
                self.stream.write(self.line() + "\n")
                self.stream.flush()

    def rate(self) -> float:
        """Bytes per second moved by this run."""
        elapsed = max(time.monotonic() - self._start, 1e-6)
        return (self._bytes - self._reused) / elapsed

    def line(self) -> str:
        """One log line: share done, sizes, files, rate and ETA, in tqdm's units."""
        total = self._bar.total
        rate = self.rate()
        eta = tqdm.format_interval((total - self._bytes) / rate) if rate > 0 else "?"
        size = tqdm.format_sizeof
        done = self._bytes / total if total else 1.0
        return (f"llmserve-model-store: {self.verb}: {done:.0%} {size(self._bytes, 'B', 1000)}/"
                f"{size(total, 'B', 1000)}, {self._files()}, {size(rate, 'B/s', 1000)}, "
                f"ETA {eta}")

    def _maybe_log(self) -> None:
        if self.mode != "log":
            return
        now = time.monotonic()
        if now - self._shown >= self.interval_s:
            self._shown = now
            self.stream.write(self.line() + "\n")
            self.stream.flush()
