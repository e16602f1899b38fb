"""Every GatewaySettings field as a CLI flag, generated from the model so the two never drift.

Flags override env (`GATEWAY_*`), which overrides defaults. Nested value objects get one flag per
field (`--timeouts-connect-s`); list fields repeat (`--backend URL --backend URL`).
"""

from __future__ import annotations

import argparse
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gateway.settings import GatewaySettings

# Singular spellings read better for repeated flags.
_FLAG_NAMES = {"backends": "backend"}


def _add_field(
    parser: argparse.ArgumentParser, dest: str, env: str, info: FieldInfo, flag: str
) -> None:
    ann = info.annotation
    origin = typing.get_origin(ann)
    default = info.get_default(call_default_factory=True)
    help_ = f"{info.description or ''} (env {env}; default {default!r})".strip()
    kwargs: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": help_}
    if origin is list:
        parser.add_argument(f"--{flag}", action="append", metavar="VALUE", **kwargs)
    elif origin is typing.Literal:
        parser.add_argument(f"--{flag}", choices=[str(c) for c in typing.get_args(ann)], **kwargs)
    elif ann is bool:
        parser.add_argument(f"--{flag}", action=argparse.BooleanOptionalAction, **kwargs)
    else:
        parser.add_argument(f"--{flag}", metavar=dest.split(".")[-1].upper(), **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m gateway",
        description="llmserve gateway: OpenAI-compatible API in front of vLLM replicas.",
    )
    for name, info in GatewaySettings.model_fields.items():
        ann = info.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            for sub, sub_info in ann.model_fields.items():
                _add_field(
                    parser, f"{name}.{sub}", f"GATEWAY_{name.upper()}__{sub.upper()}", sub_info,
                    f"{name}-{sub}".replace("_", "-"),
                )
        else:
            flag = _FLAG_NAMES.get(name, name).replace("_", "-")
            _add_field(parser, name, f"GATEWAY_{name.upper()}", info, flag)
    return parser


def settings_from_args(argv: list[str] | None = None) -> GatewaySettings:
    """Parse flags and build settings; raises SystemExit(2) with a one-line message on bad values."""
    parser = build_parser()
    ns = vars(parser.parse_args(argv))
    overrides: dict[str, Any] = {}
    for dest, value in ns.items():
        head, _, tail = dest.partition(".")
        if tail:
            overrides.setdefault(head, {})[tail] = value
        else:
            overrides[head] = value
    try:
        return GatewaySettings(**overrides)
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
