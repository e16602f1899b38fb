from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest

from model_store.__main__ import EXIT_USAGE, PROG, build_parser, main
from model_store.cliflags import VERB_SETTINGS, flag, settings_overrides, with_flag_names
from model_store.settings import MiB, SettingsError, StoreSettings, load_settings
from tests.cli import run_main, usage_error


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in StoreSettings.model_fields:
        monkeypatch.delenv(f"MODEL_STORE_{name.upper()}", raising=False)


def test_env_then_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODEL_STORE_PART_SIZE", "16MiB")
    monkeypatch.setenv("MODEL_STORE_CONCURRENCY", "3")
    monkeypatch.setenv("MODEL_STORE_PATH_STYLE", "true")
    assert load_settings().part_size == 16 * MiB
    args = build_parser().parse_args(
        ["pull", "s3://models/m/r", "d", "--concurrency", "5", "--no-path-style",
         "--endpoint-url", "http://minio:9000"]
    )
    s = load_settings(**settings_overrides(args))
    assert (s.concurrency, s.path_style, s.part_size) == (5, False, 16 * MiB)
    assert s.endpoint_url == "http://minio:9000"


@pytest.mark.parametrize(
    ("overrides", "fragment"),
    [
        ({"part_size": "1MiB"}, "MODEL_STORE_PART_SIZE=1048576 (--part-size) is outside"),
        ({"part_size": "6GiB"}, "outside S3's part limits"),
        ({"lease_ttl_s": "5", "lease_heartbeat_s": "2"}, "at most a third"),
        ({"endpoint_url": "minio:9000"}, "must start with http://"),
        ({"concurrency": "0"}, "MODEL_STORE_CONCURRENCY (--concurrency)"),
        ({"progress": "loud"}, "MODEL_STORE_PROGRESS (--progress)"),
    ],
)
def test_invalid_settings_name_env_and_flag(overrides: dict[str, str], fragment: str) -> None:
    with pytest.raises(SettingsError) as err:
        load_settings(**overrides)
    assert fragment in with_flag_names(err.value)


@pytest.fixture
def own_signals() -> Iterator[None]:
    """main() takes SIGTERM and SIGINT (a pull unwinds on them); run in-process, it gives them
    back to pytest afterwards."""
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    yield
    for sig, handler in saved.items():
        signal.signal(sig, handler)


def test_bad_env_var_is_one_line_exit_2() -> None:
    # The command as a process; the tests below run its main() in this one.
    proc = subprocess.run(
        [sys.executable, "-m", "model_store", "ls", "s3://models"],
        env={"MODEL_STORE_CONCURRENCY": "lots", "PATH": "/usr/bin"},
        capture_output=True, text=True, check=False,
    )
    assert proc.returncode == EXIT_USAGE
    usage_error(proc.stderr, PROG, "MODEL_STORE_CONCURRENCY (--concurrency)")


@pytest.mark.parametrize(("argv", "fragment"), [
    ([], "required: VERB"),
    (["push"], "required: LOCAL_DIR, S3_URL (see llmserve-model-store push --help)"),
    (["ls", "models/llama"], "'models/llama' is not an s3://bucket/prefix URL"),
    (["pull", "s3://models/m/r", "d", "--part-size", "1KiB"],
     "MODEL_STORE_PART_SIZE=1024 (--part-size)"),
    (["pull", "s3://models/m/main", "--concurrency", "0"], "MODEL_STORE_CONCURRENCY"),
    # Where to pull to, told before any request is made.
    (["pull", "s3://models/m/main"], "give DEST, or set MODEL_STORE_ROOT (--root)"),
    (["pull", "s3://models/main", "--root", "/models"], "cannot tell model and revision"),
    (["pull", "s3://models/m/main", "--root", "/models", "--model", ".."], "invalid model name"),
])
def test_bad_usage_is_one_line_exit_2(argv: list[str], fragment: str, own_signals: None) -> None:
    proc = run_main(main, *argv)
    assert proc.returncode == EXIT_USAGE
    usage_error(proc.stderr, PROG, fragment)


@pytest.mark.parametrize("verb", ["push", "pull", "ls", "verify", "bootstrap-demo"])
def test_help_on_every_verb(verb: str) -> None:
    proc = run_main(main, verb, "--help")
    assert proc.returncode == 0 and f"usage: {PROG} {verb}" in proc.stdout


def test_each_verb_offers_the_flags_of_the_settings_it_reads() -> None:
    """`push --help` lists no pull-only flag (the volume root, the lease, the free-space margin),
    `ls` only the S3 connection, `verify` only its concurrency; every setting is some verb's, and
    each verb states the one env-var rule."""
    helps = {verb: run_main(main, verb, "--help").stdout
             for verb in ("push", "pull", "ls", "verify")}
    for verb, fields in VERB_SETTINGS.items():
        for name in StoreSettings.model_fields:
            flags = helps[verb].split("Each setting flag is also")[0]  # not the epilog's example
            offered = re.search(rf"{flag(name)}(?![\w-])", flags) is not None
            assert offered == (name in fields), (verb, name)
        assert "--part-size as MODEL_STORE_PART_SIZE" in " ".join(helps[verb].split())
    assert "--root" not in helps["push"] and "--lease-ttl-s" not in helps["push"]
    assert set().union(*VERB_SETTINGS.values()) == set(StoreSettings.model_fields)
