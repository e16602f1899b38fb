"""The compare report's figures from the runs as recorded."""

from __future__ import annotations

from loadtest.metrics import RequestRecord, Run
from loadtest.report import ttft_series


def test_the_ttft_cdf_holds_every_round_of_a_level() -> None:
    def run(label: str, level: float, rnd: int, ttfts: list[float | None]) -> Run:
        return Run(label, "m", level, rnd,
                   records=[RequestRecord(start=0.0, ttft=t, error=None if t else "cut")
                            for t in ttfts])

    runs = [run("tp", 8, 0, [0.7, 0.8]), run("pp", 8, 0, [0.5]),
            run("tp", 8, 1, [0.3, None]), run("pp", 8, 1, [0.4])]
    assert ttft_series(runs) == {("tp", 8): [0.7, 0.8, 0.3], ("pp", 8): [0.5, 0.4]}
