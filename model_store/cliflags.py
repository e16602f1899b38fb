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

from pydantic import create_model
from pydantic_settings import BaseSettings, CliSettingsSource

from model_store.settings import SettingsError, StoreSettings, env_name

ENV_RULE = (
    "Each setting flag is also an env var, --part-size as MODEL_STORE_PART_SIZE (flags win); "
    "AWS_* credentials as usual."
)


def flag(field: str) -> str:
    return "--" + field.replace("_", "-")


# The settings each verb reads (a verb's --help lists only these; the others stay env vars).
_S3 = ("endpoint_url", "path_style", "region", "connect_timeout_s", "read_timeout_s",
       "max_attempts")
_PULL_ONLY = ("free_space_margin", "root", "lease_ttl_s", "lease_heartbeat_s", "lease_poll_s",
              "wait_timeout_s")
VERB_SETTINGS: dict[str, tuple[str, ...]] = {
    "push": (*_S3, "concurrency", "part_size", "progress", "progress_interval_s"),
    "pull": (*_S3, "concurrency", "part_size", *_PULL_ONLY, "progress", "progress_interval_s"),
    "ls": _S3,
    "verify": ("concurrency",),
}


def _source(parser: argparse.ArgumentParser | None = None,
            model: type[BaseSettings] = StoreSettings) -> CliSettingsSource[Any]:
    return CliSettingsSource(model, root_parser=parser, cli_kebab_case=True,
                             cli_implicit_flags=True)


def add_settings_flags(parser: argparse.ArgumentParser, verb: str) -> None:
    """The flags of the settings `verb` reads, with StoreSettings' own types and help."""
    fields = {name: (info.annotation, info) for name, info in StoreSettings.model_fields.items()
              if name in VERB_SETTINGS[verb]}
    subset = create_model(f"{verb.title()}Settings", __base__=BaseSettings, **fields)  # type: ignore[call-overload]
    _source(parser, subset)
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
