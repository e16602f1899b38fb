"""Every StoreSettings field as a flag on each verb (`part_size` -> `--part-size`), added by
pydantic-settings' own CLI source (CliSettingsSource), so settings and flags never drift.

Flags override the ``MODEL_STORE_*`` env vars, which override the defaults; a flag left out is
absent from the namespace, so the env var still applies. Values are parsed by the settings object
itself, so `--part-size 16MiB` and `MODEL_STORE_PART_SIZE=16MiB` mean the same.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from pydantic_settings import CliSettingsSource

from model_store.settings import SettingsError, StoreSettings, env_name

ENV_RULE = (
    "Each setting flag is also an env var, --part-size as MODEL_STORE_PART_SIZE (flags win); "
    "AWS_* credentials as usual."
)


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


def _source(parser: argparse.ArgumentParser | None = None) -> CliSettingsSource[StoreSettings]:
    return CliSettingsSource(StoreSettings, root_parser=parser, cli_kebab_case=True,
                             cli_implicit_flags=True)


def add_settings_flags(parser: argparse.ArgumentParser) -> None:
    _source(parser)
    parser.epilog = ENV_RULE


def settings_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given as flags (names as StoreSettings spells them)."""
    given = {k: v for k, v in vars(args).items() if k in StoreSettings.model_fields}
    return dict(_source()(parsed_args=argparse.Namespace(**given))())


def with_flag_names(exc: SettingsError) -> str:
    """The settings error, with the flag named beside the env var."""
    text = str(exc)
    for name in StoreSettings.model_fields:
        env = env_name(name)
        text = re.sub(rf"\b{env}\b(=\S+)?", rf"\g<0> ({flag(name)})", text, count=1)
    return text
