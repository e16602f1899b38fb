from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.flow.keys import KeyFileError, hash_key, load_keys


def write(tmp_path: Path, entries: list[dict[str, object]]) -> Path:
    p = tmp_path / "keys.json"
    p.write_text(json.dumps({"keys": entries}))
    return p


def test_lookup_by_hash_only(tmp_path: Path) -> None:
    path = write(tmp_path, [{"tenant": "acme", "sha256": hash_key("sk-acme"), "rpm": 60},
                            {"tenant": "zeta", "sha256": hash_key("sk-zeta").upper()}])
    assert "sk-acme" not in path.read_text()
    store = load_keys(path)
    acme = store.lookup(b"sk-acme")
    assert acme is not None and acme.tenant == "acme" and acme.rpm == 60
    zeta = store.lookup(b"sk-zeta")
    assert zeta is not None and zeta.tenant == "zeta" and zeta.rpm is None
    assert store.lookup(b"sk-acme ") is None
    assert store.lookup(b"") is None
    assert "sk-acme" not in repr(acme) and "digest" not in repr(acme)


@pytest.mark.parametrize("entry, needle", [
    ({"tenant": "a", "sha256": "sk-plaintext-key"}, "keys.0.sha256"),
    ({"tenant": "a b", "sha256": "0" * 64}, "keys.0.tenant"),
    ({"tenant": "a", "sha256": "0" * 64, "rpm": -1}, "keys.0.rpm"),
    ({"tenant": "a", "sha256": "0" * 64, "colour": "red"}, "keys.0.colour"),
])
def test_bad_file_names_the_setting_and_never_echoes_values(
    tmp_path: Path, entry: dict[str, object], needle: str
) -> None:
    with pytest.raises(KeyFileError) as info:
        load_keys(write(tmp_path, [entry]))
    msg = str(info.value)
    assert "GATEWAY_API_KEYS_FILE" in msg and needle in msg
    assert "sk-plaintext-key" not in msg


def test_duplicate_hash_and_missing_file(tmp_path: Path) -> None:
    h = hash_key("k")
    with pytest.raises(KeyFileError, match="same key hash"):
        load_keys(write(tmp_path, [{"tenant": "a", "sha256": h}, {"tenant": "b", "sha256": h}]))
    with pytest.raises(KeyFileError, match="cannot read"):
        load_keys(tmp_path / "nope.json")


def test_keys_of_one_tenant_must_agree_on_its_limits(tmp_path: Path) -> None:
    """A tenant's keys share its buckets: differing limits would depend on which key came first."""
    one, two = hash_key("sk-1"), hash_key("sk-2")
    same = load_keys(write(tmp_path, [{"tenant": "acme", "sha256": one, "rpm": 2},
                                      {"tenant": "acme", "sha256": two, "rpm": 2}]))
    assert {k.tenant for k in same.tenants()} == {"acme"}
    with pytest.raises(KeyFileError, match="tenant 'acme' differ in rpm, weight"):
        load_keys(write(tmp_path, [{"tenant": "acme", "sha256": one, "rpm": 2},
                                   {"tenant": "acme", "sha256": two, "rpm": 1000,
                                    "weight": 2}]))


def test_hash_cli() -> None:
    out = subprocess.run([sys.executable, "-m", "gateway.flow.keys"], input="sk-x\n",
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == hash_key("sk-x")


def test_a_key_digest_and_the_admin_digest_are_one_rule() -> None:
    """The keys file's sha256 and GATEWAY_ADMIN_KEY_SHA256 take the same 64 hex characters (in
    either case), from one pattern in gateway/settings.py (issue 37, item 3)."""
    from gateway.settings import SHA256_HEX, GatewaySettings

    admin = GatewaySettings.model_json_schema()["properties"]["admin_key_sha256"]
    assert {"type": "string", "pattern": SHA256_HEX} in admin["anyOf"]
    for digest in ("ab" * 32, "AB" * 32):
        assert GatewaySettings(admin_key_sha256=digest).admin_digest == bytes.fromhex(digest)
