"""`python -m loadtest compare` settings: one frozen object; flags from pydantic-settings' own CLI
source (as the gateway's and the worker's), env `LOADTEST_<NAME>`."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any, NoReturn

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, CliSettingsSource, SettingsConfigDict, SettingsError

from loadtest.errors import EXIT_USAGE, PROG, UsageError, error_line
from loadtest.metrics import parse_slos
from loadtest.workloads import WORKLOADS

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(text: str) -> float:
    m = _DURATION.match(text.strip())
    if not m or float(m.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 60s, 2m or 90")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _numbers(text: str, kind: type[float | int]) -> list[Any]:
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{text!r} is not a comma-separated list of numbers") from None
    if not values or any(v <= 0 for v in values):
        raise ValueError(f"{text!r}: give positive numbers, e.g. 1,8,32")
    return values


class CompareSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LOADTEST_", frozen=True, extra="forbid")

    host: str = Field(description="gateway base URL, e.g. http://127.0.0.1:8000")
    targets: list[str] = Field(
        description="LABEL=MODEL, twice (A then B; B/A ratios); the same model twice is an A/A run"
    )
    users: str = Field("", description="closed-loop levels: concurrent users, e.g. 1,8,32")
    rate: str = Field("", description="open-loop levels: Poisson arrivals per second, e.g. 2,4")
    duration: str = Field("60s", description="length of one run (one target at one level)")
    rounds: int = Field(2, ge=1, le=20, description="A B runs per level (A B A B for 2)")
    workload: str = Field("chat", description=f"one of {', '.join(WORKLOADS)}")
    max_tokens: int = Field(0, ge=0, description="max_tokens per request (0: the workload's)")
    seed: int = Field(0, description="workload and arrival seed (same for both targets)")
    slos: list[str] = Field(["ttft_ms=500", "tpot_ms=50"],
                            description="goodput SLOs KEY=MS (ttft_ms, tpot_ms, e2el_ms)")
    warmup_requests: int = Field(4, ge=0, description="requests per target before measuring")
    out: Path = Field(Path("run/compare"), description="directory for report.md, PNGs, JSON")
    api_key: str = Field("", description="Bearer key, if the gateway requires one")
    api_key_file: Path | None = Field(None, description="read the Bearer key from this file (a "
                                                        "mounted Secret) instead of --api-key")
    tolerance: float = Field(0.02, gt=0, lt=1, description="cross-check: largest relative "
                                                           "client/gateway difference")
    accelerator: str = Field("GPU", description="what one TP x PP rank runs on, for labels "
                                                "(make compare on CPU: core)")
    cross_check: bool = Field(True, description="compare counts with the gateway's /metrics")
    metrics_from: list[str] = Field(
        [],
        description="where the cross-check reads the gateway's counters, summed: URLs of /metrics, "
                    "or dns:NAME:PORT for every address of a headless Service (a gateway with "
                    "several replicas behind one Service; default: HOST/metrics)")
    wait: str = Field("0s", description="how long to wait for each target to answer before the "
                                        "warm-up (a Job started with the release: 30m)")
    print_report: bool = Field(False, description="print report.md at the end (a Job's log)")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError(f"{v!r} is not a base URL like http://host:port")
        return v.rstrip("/")

    @field_validator("targets")
    @classmethod
    def _targets(cls, v: list[str]) -> list[str]:
        if len(v) != 2 or any(t.count("=") < 1 or not t.split("=", 1)[0]
                              or not t.split("=", 1)[1] for t in v):
            raise ValueError("give exactly two targets as LABEL=MODEL (--target tp=m1 "
                             "--target pp=m2)")
        if v[0].split("=", 1)[0] == v[1].split("=", 1)[0]:
            raise ValueError("the two targets need different labels (a=m --target b=m for A/A)")
        return v

    @field_validator("duration")
    @classmethod
    def _duration(cls, v: str) -> str:
        seconds = parse_duration(v)
        if seconds < 1 or not seconds.is_integer():
            raise ValueError(f"{v!r}: locust runs whole seconds (1s or more)")
        return v

    @field_validator("wait")
    @classmethod
    def _wait(cls, v: str) -> str:
        if v.strip() not in ("0", "0s"):
            parse_duration(v)
        return v

    @field_validator("metrics_from")
    @classmethod
    def _metrics_from(cls, v: list[str]) -> list[str]:
        for src in v:
            if src.startswith("dns:"):
                name, _, port = src[4:].rpartition(":")
                if not name or not port.isdigit():
                    raise ValueError(f"{src!r}: write dns:NAME:PORT, e.g. "
                                     "dns:llm-llmserve-gateway-headless:8001")
            elif not src.startswith(("http://", "https://")):
                raise ValueError(f"{src!r} is neither a URL nor dns:NAME:PORT")
        return v

    @field_validator("workload")
    @classmethod
    def _workload(cls, v: str) -> str:
        if v not in WORKLOADS:
            raise ValueError(f"{v!r} is not one of {', '.join(WORKLOADS)}")
        return v

    @field_validator("slos")
    @classmethod
    def _slos(cls, v: list[str]) -> list[str]:
        parse_slos(v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _key_from_file(cls, data: Any) -> Any:
        path = data.get("api_key_file") if isinstance(data, dict) else None
        if path:
            if data.get("api_key"):
                raise ValueError("--api-key-file: give the key or the file, not both")
            try:
                data = {**data, "api_key": Path(path).read_text(encoding="utf-8").strip()}
            except OSError as exc:
                raise ValueError(f"--api-key-file: cannot read {path}: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise ValueError(f"--api-key-file: {path} is not UTF-8 text") from None
        return data

    @model_validator(mode="after")
    def _levels(self) -> CompareSettings:
        if bool(self.users) == bool(self.rate):
            raise ValueError("LOADTEST_USERS / LOADTEST_RATE: give one of --users or --rate")
        try:
            self.levels()
        except ValueError as exc:  # this validator sees both fields: name the one given
            raise ValueError(f"--{self.mode}: {exc}") from None
        return self

    # -- derived ---------------------------------------------------------------------------------

    @property
    def duration_s(self) -> float:
        return parse_duration(self.duration)

    @property
    def wait_s(self) -> float:
        return 0.0 if self.wait.strip() in ("0", "0s") else parse_duration(self.wait)

    @property
    def mode(self) -> str:
        return "users" if self.users else "rate"

    def levels(self) -> list[float]:
        return _numbers(self.users, int) if self.users else _numbers(self.rate, float)

    def target_pairs(self) -> list[tuple[str, str]]:
        return [(t.split("=", 1)[0], t.split("=", 1)[1]) for t in self.targets]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _usage_error(self.prog, f"{message} (see {self.prog} --help)")


def _usage_error(prog: str, message: str) -> NoReturn:
    error_line(prog, message)
    raise SystemExit(EXIT_USAGE)


def settings_from_args(argv: list[str]) -> CompareSettings:
    """Flags and env as settings; a refused value ends the process: one line, exit code 2."""
    try:
        return parse_settings(argv)
    except UsageError as exc:
        _usage_error(f"{PROG} compare", str(exc))


def parse_settings(argv: list[str]) -> CompareSettings:
    """Flags and env as settings: a refused value raises UsageError with the one-line message (a
    flag the parser does not know exits through it). For callers that run the comparison later
    (devstack compare checks its flags before the engines' minutes of start-up)."""
    parser = _Parser(
        prog=f"{PROG} compare",
        description="Compare two targets (pools) behind one gateway: locust runs alternating "
                    "A B A B per level, report.md, PNGs and summary.json in --out. Every flag is "
                    "also an env var LOADTEST_<NAME>.")
    source: CliSettingsSource[CompareSettings] = CliSettingsSource(
        CompareSettings, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True,
        cli_shortcuts={"targets": "target", "slos": "slo"},
    )
    try:
        given: dict[str, Any] = source(parsed_args=parser.parse_args(argv))()
        return CompareSettings(**given)
    except SettingsError as exc:  # a list flag given as malformed JSON
        why = f" ({exc.__cause__})" if exc.__cause__ and str(exc.__cause__) not in str(exc) else ""
        raise UsageError(f"{exc}{why}; repeat the flag, one value each") from None
    except ValidationError as exc:
        msgs = []
        for err in exc.errors():
            loc = "_".join(str(p) for p in err["loc"] if not isinstance(p, int))
            msg = str(err["msg"]).removeprefix("Value error, ")
            msgs.append(f"--{loc.replace('_', '-')}: {msg}" if loc else msg)
        raise UsageError("; ".join(msgs)) from None
