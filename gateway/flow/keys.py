"""API keys: loaded from a JSON file of SHA-256 hashes, looked up per request, never logged.

File format (`GATEWAY_API_KEYS_FILE`)::

    {"keys": [{"tenant": "acme", "sha256": "<64 hex chars>", "rpm": 600, "tpm": 200000,
               "priority": "normal", "max_priority": "high", "weight": 1.0}]}

Only hashes are stored, so the file hands out no working key (`python -m gateway.flow.keys`
prints a key's hash). Lookup is by the presented key's digest, whose timing reveals nothing an
attacker can steer (a hit means the digests are equal); the key is never kept, raised or logged.
"""

from __future__ import annotations

import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.settings import SHA256_HEX, Priority
from model_store.cli_error import EXIT_USAGE, error_line

# Queue classes: lower is served first (Priority's names, in that order).
PRIORITY_CLASS: dict[str, int] = {name: i for i, name in enumerate(get_args(Priority))}


class KeyFileError(ValueError):
    """The keys file is missing or malformed; the message names GATEWAY_API_KEYS_FILE."""


def _sha256_pattern(schema: dict[str, Any]) -> None:
    """What the validator below checks, as the JSON schema's pattern."""
    schema["properties"]["sha256"]["pattern"] = SHA256_HEX


class KeyEntry(BaseModel):
    """One entry of the keys file. The chart's values schema takes its JSON schema
    (deploy/helm/values_schema.py): one set of rules for gateway.apiKeys.keys and this file."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_sha256_pattern)

    tenant: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    sha256: str
    rpm: float | None = Field(None, gt=0, description="requests per minute; unset: unlimited")
    tpm: float | None = Field(None, gt=0, description="tokens per minute; unset: unlimited")
    priority: Priority | None = None
    max_priority: Priority | None = None
    weight: float = Field(1.0, gt=0, le=1000, description="fair-queueing weight of the tenant")

    @field_validator("sha256")
    @classmethod
    def _hex(cls, v: str) -> str:
        v = v.strip().lower()
        if not re.match(SHA256_HEX, v):
            raise ValueError("sha256 must be 64 hex characters (the hash, never the key itself)")
        return v


class _KeyFile(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: list[KeyEntry]


@dataclass(frozen=True, slots=True)
class ApiKey:
    """What the gateway knows about a caller. Holds no secret: only the digest."""

    tenant: str
    digest: bytes
    rpm: float | None = None
    tpm: float | None = None
    priority: Priority | None = None
    max_priority: Priority | None = None
    weight: float = 1.0

    def __repr__(self) -> str:
        return f"ApiKey(tenant={self.tenant!r})"


# What the keys of one tenant share (tenants.py): one value per tenant. The chart checks the same
# (templates/gateway/secret-api-keys.yaml, through the generated _rules.tpl).
SHARED_BY_TENANT = ("rpm", "tpm", "priority", "max_priority", "weight")


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class KeyStore:
    def __init__(self, keys: list[ApiKey]) -> None:
        self._by_digest: dict[bytes, ApiKey] = {}
        # A tenant's keys (say an old and a new one while rotating) share its buckets and its
        # queue share, built from whichever key comes first: they must agree on all of them.
        first: dict[str, ApiKey] = {}
        for k in keys:
            if k.digest in self._by_digest:
                raise KeyFileError(
                    f"GATEWAY_API_KEYS_FILE: tenants {self._by_digest[k.digest].tenant!r} and "
                    f"{k.tenant!r} list the same key hash")
            self._by_digest[k.digest] = k
            other = first.setdefault(k.tenant, k)
            differ = [f for f in SHARED_BY_TENANT if getattr(k, f) != getattr(other, f)]
            if differ:
                raise KeyFileError(
                    f"GATEWAY_API_KEYS_FILE: the keys of tenant {k.tenant!r} differ in "
                    f"{', '.join(differ)}; a tenant's keys share its limits, so give them the "
                    "same values")

    def lookup(self, presented: bytes) -> ApiKey | None:
        return self._by_digest.get(hashlib.sha256(presented).digest())

    def tenants(self) -> list[ApiKey]:
        return list(self._by_digest.values())


def load_keys(path: Path) -> KeyStore:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(
            f"GATEWAY_API_KEYS_FILE: cannot read {str(path)!r}: {exc.strerror or exc}"
        ) from None
    try:
        parsed = _KeyFile.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        # The message never quotes input values: a misplaced plaintext key must not reach a log.
        raise KeyFileError(
            f"GATEWAY_API_KEYS_FILE: {str(path)!r}: {loc or 'file'}: {first['msg']}"
        ) from None
    return KeyStore([ApiKey(digest=bytes.fromhex(e.sha256), **e.model_dump(exclude={"sha256"}))
                     for e in parsed.keys])


def main() -> int:
    """Read one API key on stdin, print the sha256 to put in the keys file."""
    key = sys.stdin.readline().strip()
    if not key:
        error_line("python -m gateway.flow.keys", "no key on stdin")
        return EXIT_USAGE
    print(hash_key(key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
