"""LoRA adapters in the store: pushed, pulled and verified like a model, and always tied to their
base; a push or a pull for the wrong base is refused in one line (exit code 2), before any
upload or download."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from model_store.adapter import AdapterInfo, adapter_info, same_base
from model_store.errors import UsageError
from model_store.manifest import MANIFEST_NAME
from model_store.marker import read_marker, write_marker
from tests.cli import EXIT_USAGE
from tests.conftest import S3Env
from tests.model_store.conftest import assert_nothing_left, assert_same_model, one_line_error

BASE = "SmolLM2-135M-Instruct"


def write_adapter(root: Path, base: str | None = f"HuggingFaceTB/{BASE}", rank: int = 8,
                  peft_type: str = "LORA") -> Path:
    """A PEFT adapter's layout: its config and a weights file (random bytes: the store does not
    read the weights)."""
    root.mkdir(parents=True, exist_ok=True)
    config: dict[str, object] = {"peft_type": peft_type, "r": rank, "lora_alpha": 16,
                                 "target_modules": ["q_proj", "v_proj"]}
    if base is not None:
        config["base_model_name_or_path"] = base
    (root / "adapter_config.json").write_text(json.dumps(config))
    (root / "adapter_model.safetensors").write_bytes(os.urandom(300_000))
    return root


# --- what an adapter is (no S3) -------------------------------------------------------------------


def test_bases_compare_by_their_last_path_segment() -> None:
    assert same_base(f"HuggingFaceTB/{BASE}", BASE)
    assert same_base(f"/models/{BASE}/", f"org/{BASE}")
    assert not same_base(f"org/{BASE}", f"{BASE}-v2")
    assert not same_base("Llama-3.1-8B", "llama-3.1-8b")  # names are case-sensitive, as paths


def test_the_config_names_the_base_and_the_rank(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", rank=16)
    assert adapter_info(d) == AdapterInfo(f"HuggingFaceTB/{BASE}", 16)
    # A flag that agrees wins (it is the platform's name for the base).
    assert adapter_info(d, BASE) == AdapterInfo(BASE, 16)
    # A directory without adapter_config.json is a model.
    (tmp_path / "m").mkdir()
    assert adapter_info(tmp_path / "m") is None


@pytest.mark.parametrize(("kwargs", "flag", "fragment"), [
    ({}, "Llama-3.1-8B", "names base model 'HuggingFaceTB/SmolLM2-135M-Instruct', not 'Llama"),
    ({"base": None}, None, "names no base model"),
    ({"base": ""}, None, "names no base model"),
    ({"peft_type": "PREFIX_TUNING"}, None, "is not a LoRA adapter"),
    ({"rank": 0}, None, "rank `r` must be a positive integer"),
])
def test_what_is_refused_as_an_adapter(
    tmp_path: Path, kwargs: dict[str, object], flag: str | None, fragment: str
) -> None:
    d = write_adapter(tmp_path / "a", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=fragment):
        adapter_info(d, flag)


@pytest.mark.parametrize(("raw", "fragment"), [
    (b"\xff\xfe{}", "is not valid JSON"),  # not UTF-8
    (b'{"r": 8', "is not valid JSON"),
    (b"[8]", "is not a JSON object"),
])
def test_an_unreadable_config_is_a_usage_error(tmp_path: Path, raw: bytes, fragment: str) -> None:
    d = write_adapter(tmp_path / "a")
    (d / "adapter_config.json").write_bytes(raw)
    with pytest.raises(UsageError, match=f"adapter_config.json {fragment}"):
        adapter_info(d)


def test_the_flag_names_a_base_the_config_leaves_out(tmp_path: Path) -> None:
    d = write_adapter(tmp_path / "a", base=None)
    assert adapter_info(d, BASE) == AdapterInfo(BASE, 8)
    (tmp_path / "m").mkdir()
    with pytest.raises(UsageError, match="--base-model is for adapters"):
        adapter_info(tmp_path / "m", BASE)


def test_the_marker_carries_the_adapter_and_older_markers_still_read(tmp_path: Path) -> None:
    write_marker(tmp_path, "s3://b/a", {}, adapter=AdapterInfo(BASE, 8))
    marker = read_marker(tmp_path)
    assert marker is not None and marker.adapter == AdapterInfo(BASE, 8)
    write_marker(tmp_path, "s3://b/m", {})
    marker = read_marker(tmp_path)
    assert marker is not None and marker.adapter is None


# --- through the loopback S3 server ---------------------------------------------------------------


@pytest.mark.s3
def test_an_adapter_round_trip_records_its_base(s3: S3Env, tmp_path: Path) -> None:
    local = write_adapter(tmp_path / "local")
    bucket = s3.bucket()
    url = f"s3://{bucket}/adapters/sql/v1"
    proc = s3.cli("push", local, url, "--base-model", BASE)
    assert proc.returncode == 0, proc.stderr
    assert f"LoRA adapter of {BASE} (rank 8)" in proc.stderr
    doc = json.loads(s3.client().get_object(
        Bucket=bucket, Key=f"adapters/sql/v1/{MANIFEST_NAME}")["Body"].read())
    assert doc["adapter"] == {"base_model": BASE, "rank": 8}
    listing = s3.cli("ls", f"s3://{bucket}")
    assert listing.returncode == 0 and f"adapter of {BASE}" in listing.stdout

    dest = tmp_path / "vol" / "adapters" / "sql" / "v1"
    proc = s3.cli("pull", url, dest, "--base-model", f"/models/{BASE}")
    assert proc.returncode == 0, proc.stderr
    assert_same_model(dest, local)
    marker = read_marker(dest)
    assert marker is not None and marker.adapter == AdapterInfo(BASE, 8)
    ok = s3.cli("verify", dest)
    assert ok.returncode == 0 and f"LoRA adapter of {BASE}" in ok.stderr
    # Without --base-model an adapter pulls like a model.
    plain = s3.cli("pull", url, tmp_path / "plain")
    assert plain.returncode == 0, plain.stderr


@pytest.mark.s3
def test_a_pull_for_the_wrong_base_fetches_nothing(s3: S3Env, tmp_path: Path) -> None:
    local = write_adapter(tmp_path / "local")
    bucket = s3.bucket()
    url = f"s3://{bucket}/adapters/sql/v1"
    assert s3.cli("push", local, url).returncode == 0
    before = s3.counter.sent[bucket]
    dest = tmp_path / "vol" / "adapters" / "sql" / "v1"
    proc = s3.cli("pull", url, dest, "--base-model", "Llama-3.1-8B")
    assert proc.returncode == EXIT_USAGE
    one_line_error(proc.stderr, f"{url} is an adapter of 'HuggingFaceTB/{BASE}', not of "
                                "'Llama-3.1-8B'")
    assert s3.counter.sent[bucket] == before  # refused from the manifest alone
    assert_nothing_left(dest)

    # A complete DEST is judged by its marker, again without a byte from S3.
    assert s3.cli("pull", url, dest, "--base-model", BASE).returncode == 0
    pulled = s3.counter.sent[bucket]
    again = s3.cli("pull", url, dest, "--base-model", "Llama-3.1-8B")
    assert again.returncode == EXIT_USAGE
    one_line_error(again.stderr, f"{dest} is an adapter of")
    assert s3.counter.sent[bucket] == pulled


@pytest.mark.s3
def test_a_model_is_not_an_adapter(s3: S3Env, tmp_path: Path) -> None:
    local = tmp_path / "model"
    local.mkdir()
    (local / "config.json").write_text("{}")
    bucket = s3.bucket()
    url = f"s3://{bucket}/{BASE}/main"
    pushed = s3.cli("push", local, url, "--base-model", BASE)
    assert pushed.returncode == EXIT_USAGE
    one_line_error(pushed.stderr, "--base-model is for adapters")
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket)  # nothing uploaded
    assert s3.cli("push", local, url).returncode == 0
    dest = tmp_path / "vol" / "m"
    proc = s3.cli("pull", url, dest, "--base-model", BASE)
    assert proc.returncode == EXIT_USAGE
    one_line_error(proc.stderr, "is a model, not an adapter")
    assert_nothing_left(dest)


@pytest.mark.s3
def test_a_push_for_the_wrong_base_uploads_nothing(s3: S3Env, tmp_path: Path) -> None:
    local = write_adapter(tmp_path / "local")
    bucket = s3.bucket()
    proc = s3.cli("push", local, f"s3://{bucket}/adapters/sql/v1", "--base-model", "Qwen2.5-7B")
    assert proc.returncode == EXIT_USAGE
    one_line_error(proc.stderr, "refusing an adapter for the wrong base")
    assert "Contents" not in s3.client().list_objects_v2(Bucket=bucket)
