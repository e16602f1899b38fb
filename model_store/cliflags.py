"""Every StoreSettings field as a CLI flag (`part_size` -> `--part-size`), generated from the fields.

Flags override the ``MODEL_STORE_*`` env vars, which override the defaults; a flag left out does
not appear in the namespace (SUPPRESS), so the env var still applies. Values are parsed by the
settings object itself, so `--part-size 16MiB` and `MODEL_STORE_PART_SIZE=16MiB` mean the same.
"""

from __future__ import annotations

import argparse
import re
import typing
from typing import Any

from model_store.settings import SettingsError, StoreSettings, env_name


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _default_text(value: Any) -> str:
    return "unset" if value is None else str(value)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group(
        "S3 and transfer settings (each also an env var; flags win; AWS_* credentials as usual)"
    )
    for name, info in StoreSettings.model_fields.items():
        help_text = (
            f"{info.description} [env {env_name(name)}; default {_default_text(info.default)}]"
        ).replace("%", "%%")
        kwargs: dict[str, Any] = {"dest": f"setting_{name}", "default": argparse.SUPPRESS}
        if info.annotation is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(info.annotation) is typing.Literal:
            kwargs["choices"] = list(typing.get_args(info.annotation))
        else:
            kwargs["metavar"] = name.upper()
        group.add_argument(flag(name), help=help_text, **kwargs)


def settings_overrides(args: argparse.Namespace) -> dict[str, object]:
    return {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_")
    }


def with_flag_names(exc: SettingsError) -> str:
    """The settings error, with the flag named beside the env var."""
    text = str(exc)
    for name in StoreSettings.model_fields:
        env = env_name(name)
        text = re.sub(rf"\b{env}\b(=\S+)?", rf"\g<0> ({flag(name)})", text, count=1)
    return text
