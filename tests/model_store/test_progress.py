"""Progress of a push or pull: a tqdm bar on a terminal, plain lines in logs, nothing when off."""

from __future__ import annotations

import io

from model_store.progress import Progress, resolve_mode


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_mode_follows_the_stream() -> None:
    assert resolve_mode("auto", Tty()) == "bar"
    assert resolve_mode("auto", io.StringIO()) == "log"
    assert resolve_mode("off", Tty()) == "off"


def test_log_lines_count_resumed_bytes_toward_the_total_not_the_rate() -> None:
    out = io.StringIO()
    p = Progress("pull", 400_000_000, 4, mode="log", interval_s=0.0, stream=out,
                 done_bytes=100_000_000, done_files=1)
    p.add(100_000_000)
    p.file_done()
    assert p.bytes == 200_000_000 and p.files == 2
    p.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("llmserve-model-store: pull: 50% 200MB/400MB, 1/4 files, ")
    assert lines[-1].startswith("llmserve-model-store: pull: 50% 200MB/400MB, 2/4 files, ")
    assert "ETA" in lines[-1] and "\r" not in out.getvalue()


def test_bar_is_drawn_on_a_terminal_and_left_complete() -> None:
    out = Tty()
    p = Progress("push", 1_000_000, 2, mode="bar", interval_s=60, stream=out)
    p.add(1_000_000)
    p.file_done()
    p.file_done()
    p.close()
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert last.startswith("push: 100%") and "1.00M/1.00M" in last and "2/2 files" in last


def test_off_writes_nothing() -> None:
    out = Tty()
    p = Progress("pull", 10, 1, mode="off", interval_s=0.0, stream=out)
    p.add(10)
    p.file_done()
    p.close()
    assert out.getvalue() == ""
