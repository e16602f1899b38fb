"""`llmserve-gateway` (`python -m gateway`) flags: every GatewaySettings field, added by
pydantic-settings' CliSettingsSource, so settings and flags never drift. Flags override env
(`GATEWAY_*`), which overrides defaults; nested objects get dotted flags (`--flow.max-limit`);
lists repeat (`--backend URL --backend URL`). A bad flag or env var ends the process with one
line, `llmserve-gateway: error: ...`, and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import re
from typing import Any, NoReturn

from pydantic import BaseModel, ValidationError
from pydantic_settings import CliSettingsSource, SettingsError

from gateway.settings import GatewaySettings
from model_store import cli_error
from model_store.cli_error import EXIT_USAGE

PROG = "llmserve-gateway"
ENV_PREFIX = "GATEWAY_"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line naming the problem, not a 40-line usage dump.
        fail(f"{message} (see {self.prog} --help)")


def fail(message: str) -> NoReturn:
    """The one shape of a usage error: one line on stderr, exit code 2."""
    cli_error.fail(PROG, message, EXIT_USAGE)


def build_parser() -> tuple[argparse.ArgumentParser, CliSettingsSource[GatewaySettings]]:
    parser = _Parser(
        prog=PROG,
        description="llmserve gateway: OpenAI-compatible API in front of vLLM replicas. Every "
                    "flag is also an env var: GATEWAY_<NAME>, GATEWAY_<GROUP>__<NAME> for a "
                    "dotted one (GATEWAY_FLOW__MAX_LIMIT for --flow.max-limit).")
    source: CliSettingsSource[GatewaySettings] = CliSettingsSource(
        GatewaySettings, root_parser=parser, cli_kebab_case=True, cli_implicit_flags=True,
        cli_shortcuts={"backends": "backend"})
    return parser, source


class UsageError(ValueError):
    """A flag's or env var's value the settings refuse; the message is the one error line."""


def parse_settings(argv: list[str] | None = None) -> GatewaySettings:
    """Flags and env as settings: a refused value raises UsageError (a flag the parser does not
    know exits through it). What the process would do with `argv`, for callers that start the
    gateway later (devstack checks its flags before the engines' minutes of start-up)."""
    parser, source = build_parser()
    try:
        given: dict[str, Any] = source(parsed_args=parser.parse_args(argv))()
        return GatewaySettings(**given)
    except ValidationError as exc:
        raise UsageError(describe(exc)) from None
    except SettingsError as exc:
        raise UsageError(describe_unparsed(exc)) from None


def settings_from_args(argv: list[str] | None = None) -> GatewaySettings:
    """Parse flags and build settings; exits with code 2 and one line on a bad flag or env var."""
    try:
        return parse_settings(argv)
    except UsageError as exc:
        fail(str(exc))


def flag(path: list[str]) -> str:
    """`--flow.max-limit` for ["flow", "max_limit"]."""
    return "--" + ".".join(p.replace("_", "-") for p in path)


def env_name(path: list[str]) -> str:
    """`GATEWAY_FLOW__MAX_LIMIT` for ["flow", "max_limit"]."""
    return ENV_PREFIX + "__".join(path).upper()


def _setting_path(loc: tuple[int | str, ...]) -> tuple[list[str], str]:
    """The settings fields a validation error's location walks through, and the rest (a dict
    key, a list index) as a suffix: (["routing_policies"], "['m']")."""
    path: list[str] = []
    model: type[BaseModel] | None = GatewaySettings
    rest = ""
    for part in loc:
        if model is not None and isinstance(part, str) and part in model.model_fields:
            path.append(part)
            annotation = model.model_fields[part].annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                model = annotation
            else:
                model = None
        else:
            model = None
            rest += f"[{part!r}]"
    return path, rest


def describe(exc: ValidationError) -> str:
    """Each error with the env var and the flag that set it, the rule, and the value given."""
    parts = []
    for err in exc.errors():
        path, rest = _setting_path(err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        name = env_name(path) if path else ""
        given = repr(err.get("input"))
        if name and name not in msg:
            got = "" if given in msg else f" (got {given})"
            parts.append(f"{name}{rest} ({flag(path)}): {msg}{got}")
        else:
            parts.append(msg)
    return "; ".join(parts)


_UNPARSED = re.compile(r'field "(?P<field>\w+)" from source "(?P<source>\w+)"')


def describe_unparsed(exc: SettingsError) -> str:
    """A value pydantic-settings could not decode (JSON for a list, dict or nested object), with
    what it should look like."""
    m = _UNPARSED.search(str(exc))
    if m is None:
        return str(exc)
    field = m["field"]
    if m["source"].startswith("Cli"):
        where = flag([field])
    else:
        where = f"{env_name([field])}={os.environ.get(env_name([field]), '')!r}"
    why = f" ({exc.__cause__})" if exc.__cause__ is not None else ""
    return f"{where} is not valid JSON{why}; {_json_hint(field)}"


def _json_hint(field: str) -> str:
    info = GatewaySettings.model_fields[field]
    default = info.default
    if isinstance(default, BaseModel):
        name, value = next((k, v) for k, v in default if not isinstance(v, bool))
        example = default.model_dump_json(include={name})
        return (f"give a JSON object such as '{example}', or the dotted flags such as "
                f"{flag([field, name])} {value}")
    if info.description and "JSON:" in info.description:
        return "give JSON like " + info.description.split("JSON:", 1)[1].strip()
    return "give JSON, e.g. " + ('{"name": "value"}' if isinstance(default, dict) else '["a", "b"]')
