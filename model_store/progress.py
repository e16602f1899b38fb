"""Bytes, files, rate and ETA: a bar on a terminal, log lines otherwise (Job logs, CI)."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

BAR_REDRAW_S = 0.1
BAR_WIDTH = 24


def resolve_mode(setting: str, stream: TextIO) -> str:
    if setting == "auto":
        return "bar" if stream.isatty() else "log"
    return setting


def _mb(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def _eta(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


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
        self.total_bytes, self.total_files = total_bytes, total_files
        self.bytes, self.files = done_bytes, done_files
        self._reused = done_bytes  # not transferred by this run: excluded from the rate
        self._lock = threading.Lock()
        self._start = self._shown = time.monotonic()

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += n
            self._maybe_show()

    def file_done(self) -> None:
        with self._lock:
            self.files += 1
            self._maybe_show()

    def close(self) -> None:
        with self._lock:
            if self.mode == "bar":
                self.stream.write(self._bar() + "\n")
            elif self.mode == "log":
                self.stream.write(self._line() + "\n")
            self.stream.flush()

    def rate(self) -> float:
        elapsed = max(time.monotonic() - self._start, 1e-6)
        return (self.bytes - self._reused) / elapsed

    def _maybe_show(self) -> None:
        now = time.monotonic()
        if self.mode == "bar" and now - self._shown >= BAR_REDRAW_S:
            self.stream.write("\r" + self._bar())
        elif self.mode == "log" and now - self._shown >= self.interval_s:
            self.stream.write(self._line() + "\n")
        else:
            return
        self.stream.flush()
        self._shown = now

    def _numbers(self) -> str:
        rate = self.rate()
        left = self.total_bytes - self.bytes
        eta = _eta(left / rate) if rate > 0 else "?"
        return (
            f"{_mb(self.bytes)}/{_mb(self.total_bytes)}  {self.files}/{self.total_files} files  "
            f"{rate / 1e6:,.1f} MB/s  ETA {eta}"
        )

    def _bar(self) -> str:
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        filled = int(frac * BAR_WIDTH)
        return f"{self.verb} [{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {frac:4.0%}  " + (
            self._numbers()
        )

    def _line(self) -> str:
        frac = self.bytes / self.total_bytes if self.total_bytes else 1.0
        return f"model_store: {self.verb}: {frac:.0%}  {self._numbers()}"
