"""`python -m gateway` flags: every GatewaySettings field, added by pydantic-settings' own CLI
source (CliSettingsSource) to this parser, so settings and flags never drift.

Flags override env (`GATEWAY_*`), which overrides defaults. Nested value objects get dotted
flags (`--timeouts.connect-s`, `--flow.max-limit`, `--no-flow.enabled`); lists repeat
(`--backends URL --backends URL`, or `--backend`).
"""

from __future__ import annotations

import argparse
from typing import Any, NoReturn

from pydantic import ValidationError
from pydantic_settings import CliSettingsSource

from gateway.settings import GatewaySettings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the problem, not a 40-line usage dump.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource[GatewaySettings]]:
    parser = _Parser(
        prog="python -m gateway",
        description="llmserve gateway: OpenAI-compatible API in front of vLLM replicas. Every "
                    "flag is also an env var: GATEWAY_<NAME>, GATEWAY_<GROUP>__<NAME> for a "
                    "dotted one (GATEWAY_FLOW__MAX_LIMIT for --flow.max-limit).",
    )
    source: CliSettingsSource[GatewaySettings] = CliSettingsSource(
        GatewaySettings, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True,
        cli_shortcuts={"backends": "backend"},
    )
    return parser, source


def settings_from_args(argv: list[str] | None = None) -> GatewaySettings:
    """Parse flags and build settings; raises SystemExit(2) with a one-line message on bad values."""
    parser, source = build_parser()
    given: dict[str, Any] = source(parsed_args=parser.parse_args(argv))()
    try:
        return GatewaySettings(**given)
    except ValidationError as exc:
        parser.exit(2, f"{parser.prog}: error: {describe(exc)}\n")


def describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = "__".join(str(p) for p in err["loc"] if not isinstance(p, int))
        msg = str(err["msg"]).removeprefix("Value error, ")
        name = f"GATEWAY_{loc.upper()}" if loc else ""
        if name and name not in msg:
            given = err.get("input")
            parts.append(f"{name}: {msg} (got {given!r})")
        else:
            parts.append(msg)
    return "; ".join(parts)
