"""`llmserve-gateway` flags and env: what they accept, the one-line errors (exit code 2) for what
they refuse, and a --help that shows every default."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from gateway.cli import PROG, build_parser, settings_from_args
from gateway.settings import GatewaySettings
from tests.cli import EXIT_USAGE, usage_error

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_gateway_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in GatewaySettings.model_fields:
        monkeypatch.delenv(f"GATEWAY_{name.upper()}", raising=False)


@pytest.mark.parametrize("value", [
    "http://a:8000,http://b:8000",
    " http://a:8000 , http://b:8000/ ",
    '["http://a:8000", "http://b:8000"]',
])
def test_backends_env_takes_urls_as_the_flag_does(value: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_BACKENDS", value)
    assert settings_from_args([]).backends == ["http://a:8000", "http://b:8000"]


def test_one_backend_url_in_the_env(monkeypatch: pytest.MonkeyPatch) -> None:
    # The command: GATEWAY_BACKENDS=http://a:8000 python -m gateway.
    monkeypatch.setenv("GATEWAY_BACKENDS", "http://a:8000")
    assert settings_from_args([]).backends == ["http://a:8000"]


@pytest.mark.parametrize("argv", [
    ["--backend", "http://a:8000", "--backend", "http://b:8000"],
    ["--backends", "http://a:8000,http://b:8000"],
    ["--backends", '["http://a:8000","http://b:8000"]'],
])
def test_backends_flag_forms(argv: list[str]) -> None:
    assert settings_from_args(argv).backends == ["http://a:8000", "http://b:8000"]


@pytest.mark.parametrize(("argv", "env", "fragment"), [
    (["--routing-policy", "fastest"], {},
     ("GATEWAY_ROUTING_POLICY (--routing-policy): Input should be 'prefix_affinity', "
     "'least_outstanding', 'round_robin' or 'kv_aware' (got 'fastest')")),
    (["--flow", "{bad"], {},
     ("--flow is not valid JSON (Expecting property name enclosed in double quotes: line 1 column "
     "2 (char 1)); give a JSON object such as '{\"ttft_target_s\":4.0}', or the dotted flags "
     "such as --flow.ttft-target-s 4.0")),
    ([], {"GATEWAY_FLOW": "{bad"}, "GATEWAY_FLOW='{bad' is not valid JSON"),
    ([], {"GATEWAY_POOLS": "tp"}, ('GATEWAY_POOLS=\'tp\' is not valid JSON (Expecting value: '
                                  'line 1 column 1 (char 0)); give JSON like [{"name": "tp"')),
    # Values the gateway would otherwise accept and ignore (issue 37, item 7).
    ([], {"GATEWAY_POOLS": '[{"name": "p", "model": "m", "wake_budget_s": 60}]'},
     "pool 'p' sets wake_budget_s without scale_to_zero"),
    ([], {"GATEWAY_POOLS": '[{"name": "p", "model": "m"}, {"name": "p", "model": "n"}]'},
     "GATEWAY_POOLS: pool name(s) ['p'] declared twice"),
    ([], {"GATEWAY_POOLS": '[{"name": "p", "model": "m", "adapters": ["n"]}, '
                           '{"name": "q", "model": "n"}]'},
     "GATEWAY_POOLS: adapter(s) ['n'] named like a pool's model"),
    ([], {"GATEWAY_ROUTING_POLICIES": '{"m": "fastest"}'},
     "GATEWAY_ROUTING_POLICIES['m'] (--routing-policies): Input should be 'prefix_affinity'"),
    (["--backends", "[http://a:8000"], {}, ("GATEWAY_BACKENDS (--backends): '[http://a:8000' is "
                                           "not a JSON list")),
    (["--backend", "a:8000"], {}, "'a:8000' is not a base URL like http://host:port"),
    (["--flow.max-limit", "lots"], {},
     "GATEWAY_FLOW__MAX_LIMIT (--flow.max-limit): Input should be a valid integer"),
    (["--edge.probe-port", "8000"], {}, "GATEWAY_EDGE__PROBE_PORT must differ from GATEWAY_PORT"),
    (["--mode", "epp", "--epp.port", "9090"], {},
     "GATEWAY_EPP__PORT must differ from GATEWAY_PORT and GATEWAY_EPP__METRICS_PORT"),
    # A drain shorter than the longest request would cut streams the gateway lets run (item 2).
    ([], {"GATEWAY_DRAIN_TIMEOUT_S": "30"},
     "GATEWAY_DRAIN_TIMEOUT_S=30 is shorter than GATEWAY_TIMEOUTS__TOTAL_S=900"),
    (["--eject-after-failures", "0"], {},
     "GATEWAY_EJECT_AFTER_FAILURES (--eject-after-failures): Input should be greater than or equal to 1"),
    ([], {"GATEWAY_HEALTH_INTERVAL_S": "0"},
     "GATEWAY_HEALTH_INTERVAL_S (--health-interval-s): Input should be greater than 0"),
    (["--no-such-flag"], {}, ("unrecognized arguments: --no-such-flag (see llmserve-gateway "
                             "--help)")),
])
def test_bad_flag_or_env_is_one_line_and_exit_2(
        argv: list[str], env: dict[str, str], fragment: str,
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit) as exc:
        settings_from_args(argv)
    assert exc.value.code == EXIT_USAGE
    usage_error(capsys.readouterr().err, PROG, fragment)


@pytest.mark.parametrize(("argv", "env"), [
    (["--routing-policy", "fastest"], {}),
    (["--flow", "{bad"], {}),
    ([], {"GATEWAY_BACKENDS": "http://a:8000,ftp://b"}),
])
def test_the_process_exits_2_with_one_line(argv: list[str], env: dict[str, str]) -> None:
    # The commands as a user runs them: the whole process, not only the parser.
    proc = subprocess.run([sys.executable, "-m", "gateway", *argv], capture_output=True,
                          text=True, timeout=30, check=False, cwd=REPO,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == EXIT_USAGE
    usage_error(proc.stderr, PROG)


def _help_by_flag() -> dict[str, str]:
    """Each option's help entry (flag, metavar, text, default) on one line, by its first flag."""
    text = build_parser()[0].format_help()
    # An entry starts at a line "  --flag"; a blank line ends a group of them.
    parts = re.split(r"\n  (?=--)|\n\n", text)
    entries = [" ".join(p.split()) for p in parts if p.startswith("--")]
    return {e.split()[0].rstrip(","): e for e in entries}


def test_help_shows_every_default() -> None:
    entries = _help_by_flag()
    assert not [e for e in entries.values() if "default factory" in e]
    defaults = GatewaySettings()
    for name in GatewaySettings.model_fields:
        value = getattr(defaults, name)
        flag = "--" + name.replace("_", "-")
        if isinstance(value, BaseModel):  # each nested flag with its own default
            for sub, sub_value in value:
                shown = str(sub_value)  # pydantic-settings prints a nested None as None
                entry = entries[f"{flag}.{sub.replace('_', '-')}"]
                assert entry.endswith(f"(default: {shown})"), entry
        else:
            shown = json.dumps(value) if value is None else str(value)
            assert entries[flag].endswith(f"(default: {shown})"), entries[flag]


def test_help_exits_0_naming_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        settings_from_args(["--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {PROG} ")
