"""The model store's one settings object (``MODEL_STORE_*`` env vars, each also a CLI flag).

Endpoint, region and credentials otherwise come from the standard AWS environment and config files
(``AWS_ACCESS_KEY_ID``, ``AWS_PROFILE``, ``AWS_REGION`` ...): boto3 resolves them, we never read
or store a secret ourselves. The object is frozen and checked at construction; every error names the
setting as its env var (and the CLI says the flag too).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import ByteSize, Field, ValidationError, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "MODEL_STORE_"
MiB = 1 << 20
# S3 refuses multipart parts below 5 MiB (except the last) and above 5 GiB; the same size is used
# for ranged GETs, so one limit keeps push and pull symmetrical.
MIN_PART = 5 * MiB
MAX_PART = 5 << 30


class SettingsError(ValueError):
    """A setting is malformed or inconsistent; the message names it."""


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


class StoreSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, frozen=True, extra="forbid", env_ignore_empty=True
    )

    # --- where S3 is ---------------------------------------------------------------------------
    endpoint_url: str | None = Field(
        None,
        description="S3 endpoint, e.g. http://minio:9000; empty: AWS S3 (or AWS_ENDPOINT_URL).",
    )
    path_style: bool = Field(
        False,
        description="Path-style addressing (http://host/bucket/key), which MinIO usually needs.",
    )
    region: str | None = Field(
        None, description="Region; empty: the standard AWS resolution (AWS_REGION, config file)."
    )
    connect_timeout_s: float = Field(5.0, gt=0, description="TCP connect timeout per request.")
    read_timeout_s: float = Field(60.0, gt=0, description="Socket read timeout per request.")
    max_attempts: int = Field(
        5, ge=1, le=20, description="Attempts per request (botocore standard retries)."
    )

    # --- transfer ------------------------------------------------------------------------------
    concurrency: int = Field(8, ge=1, le=128, description="Parallel requests (GETs or part PUTs).")
    part_size: ByteSize = Field(
        ByteSize(64 * MiB),
        description="Multipart part size, and the smallest ranged GET, e.g. 64MiB (5MiB..5GiB).",
    )
    free_space_margin: ByteSize = Field(
        ByteSize(64 * MiB),
        description="Free space to keep on the volume beyond the model's size, e.g. 1GiB.",
    )

    # --- the shared volume ---------------------------------------------------------------------
    root: Path | None = Field(
        None,
        description="Models root for `pull` without DEST: ROOT/<model>/<revision>/.",
    )
    lease_ttl_s: float = Field(
        60.0,
        gt=0,
        description="A lease whose heartbeat has not moved for this long is taken over.",
    )
    lease_heartbeat_s: float = Field(
        10.0, gt=0, description="How often the lease holder proves it is alive."
    )
    lease_poll_s: float = Field(
        1.0, gt=0, description="How often a waiting puller looks at the lease and the marker."
    )
    wait_timeout_s: float = Field(
        0.0,
        ge=0,
        description="Give up waiting for another puller after this long; 0: wait for ever.",
    )

    # --- output --------------------------------------------------------------------------------
    progress: Literal["auto", "bar", "log", "off"] = Field(
        "auto", description="auto: a bar on a terminal, log lines otherwise."
    )
    progress_interval_s: float = Field(
        10.0, gt=0, description="Seconds between progress log lines (log mode)."
    )

    @model_validator(mode="after")
    def _consistent(self) -> StoreSettings:
        if not MIN_PART <= self.part_size <= MAX_PART:
            raise ValueError(
                f"{env_name('part_size')}={self.part_size} is outside S3's part limits "
                f"({MIN_PART} bytes = 5MiB .. 5GiB)"
            )
        # Three missed heartbeats before a takeover: one slow NFS write must not cost the lease.
        if self.lease_heartbeat_s * 3 > self.lease_ttl_s:
            raise ValueError(
                f"{env_name('lease_heartbeat_s')}={self.lease_heartbeat_s} must be at most a third "
                f"of {env_name('lease_ttl_s')}={self.lease_ttl_s}"
            )
        if self.endpoint_url is not None and not self.endpoint_url.startswith(
            ("http://", "https://")
        ):
            raise ValueError(
                f"{env_name('endpoint_url')}={self.endpoint_url!r} must start with http:// or "
                "https://"
            )
        return self


def load_settings(**overrides: object) -> StoreSettings:
    """Env vars, then CLI overrides on top; any problem becomes one SettingsError line."""
    try:
        return StoreSettings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = first["msg"].removeprefix("Value error, ")
        if loc:
            raise SettingsError(f"{env_name(loc)}: {msg}") from None
        raise SettingsError(msg) from None
