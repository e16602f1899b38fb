"""A pool's LoRA adapters: the settings, vLLM's flags, and the checks before vLLM loads them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from model_store.adapter import AdapterInfo
from model_store.marker import write_marker
from tests.cli import EXIT_USAGE, usage_error
from tests.worker.conftest import ModelDirFactory
from worker.__main__ import PROG
from worker.__main__ import main as worker_main
from worker.argv import RUNTIME_LORA_ENV, Host, build_command
from worker.launcher import Launcher, MarkerTimeout
from worker.lora import check_adapters, rank_limit, with_rank
from worker.settings import SettingsError, load_settings

HOST = Host(python="/usr/bin/python3", cpus=(0, 1))
BASE = "SmolLM2-135M-Instruct"


def make_adapter(root: Path, base: str = f"HuggingFaceTB/{BASE}", rank: int = 8,
                 pulled: bool = True) -> Path:
    """An adapter directory as `model_store pull --base-model` leaves it (marker with its base
    and rank), or with only its own config and a bare marker (`pulled=False`)."""
    root.mkdir(parents=True)
    (root / "adapter_config.json").write_text(json.dumps(
        {"peft_type": "LORA", "r": rank, "base_model_name_or_path": base}))
    write_marker(root, "test", {}, adapter=AdapterInfo(base, rank) if pulled else None)
    return root


# --- settings -------------------------------------------------------------------------------------


def test_adapters_as_a_list_or_json(monkeypatch: pytest.MonkeyPatch) -> None:
    s = load_settings(model_path="/m/x", lora_adapters=" sql=/a/sql , chat=/a/chat ")
    assert s.lora_adapters == {"sql": Path("/a/sql"), "chat": Path("/a/chat")}
    assert s.lora_enabled and s.resolved_max_loras == 2 and s.max_lora_rank is None
    monkeypatch.setenv("WORKER_LORA_ADAPTERS", '{"sql": "/a/sql"}')
    monkeypatch.setenv("WORKER_MODEL_PATH", "/m/x")
    assert load_settings().lora_adapters == {"sql": Path("/a/sql")}
    monkeypatch.delenv("WORKER_LORA_ADAPTERS")
    off = load_settings(model_path="/m/x")
    assert not off.lora_enabled and off.resolved_max_loras == 1
    assert load_settings(model_path="/m/x", lora=True).lora_enabled


@pytest.mark.parametrize(("kwargs", "fragment"), [
    ({"lora_adapters": "sql"}, "'sql' is not name=directory"),
    ({"lora_adapters": "a=/x,a=/y"}, "adapter 'a' is given twice"),
    ({"lora_adapters": "bad name=/x"}, "adapter name 'bad name'"),
    ({"lora_adapters": "x=/a/x"}, "adapter 'x' has the model's own name"),
    ({"max_lora_rank": 12}, "WORKER_MAX_LORA_RANK: vLLM takes one of 1, 8, 16"),
    ({"max_loras": 0}, "WORKER_MAX_LORAS"),
])
def test_bad_lora_settings_name_the_variable(kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(SettingsError, match=fragment):
        load_settings(model_path="/m/x", **kwargs)


# --- vLLM's command line --------------------------------------------------------------------------


def test_adapters_become_vllms_lora_flags() -> None:
    s = load_settings(model_path=f"/models/{BASE}/main", device="cpu",
                      lora_adapters="sql=/models/adapters/sql/v1", max_lora_rank=16)
    cmd = build_command(s, HOST)
    argv = list(cmd.argv)
    assert argv[argv.index("--max-loras") + 1] == "1"
    assert argv[argv.index("--max-lora-rank") + 1] == "16"
    module = json.loads(argv[argv.index("--lora-modules") + 1])
    assert module == {"name": "sql", "path": "/models/adapters/sql/v1", "base_model_name": BASE}
    assert "--enable-lora" in argv and cmd.env[RUNTIME_LORA_ENV] == "True"
    # The LoRA flags come before the user's extra args, which may still override them.
    assert argv.index("--enable-lora") < argv.index("--host")


def test_no_lora_no_flags_and_runtime_updates_can_be_off() -> None:
    plain = build_command(load_settings(model_path="/m/x", device="cpu"), HOST)
    assert "--enable-lora" not in plain.argv and RUNTIME_LORA_ENV not in plain.env
    only_runtime = build_command(load_settings(model_path="/m/x", lora=True, max_loras=4), HOST)
    argv = list(only_runtime.argv)
    assert "--lora-modules" not in argv and argv[argv.index("--max-loras") + 1] == "4"
    closed = build_command(load_settings(model_path="/m/x", lora=True,
                                         lora_runtime_updates=False), HOST)
    assert RUNTIME_LORA_ENV not in closed.env


@pytest.mark.parametrize(("ranks", "limit"), [
    ([8], 8), ([9, 2], 16), ([300], 320), ([], 16), ([1], 1), ([512], 512),
])
def test_rank_limit_is_the_smallest_vllm_takes(ranks: list[int], limit: int) -> None:
    assert rank_limit(ranks) == limit


def test_a_rank_above_vllms_largest_is_refused() -> None:
    with pytest.raises(SettingsError, match="exceeds vLLM's largest --max-lora-rank"):
        rank_limit([1024])


# --- checks against the model ---------------------------------------------------------------------


def test_adapters_of_this_model_pass_and_size_the_rank(
    tmp_path: Path, make_model_dir: ModelDirFactory
) -> None:
    model = make_model_dir(BASE)
    a = make_adapter(tmp_path / "a", rank=8)
    b = make_adapter(tmp_path / "b", base=f"/models/{BASE}", rank=32, pulled=False)
    s = load_settings(model_path=model, served_model_name="chat", lora_adapters={"a": a, "b": b})
    adapters = check_adapters(s)
    assert [x.info.rank for x in adapters] == [8, 32]
    assert with_rank(s, adapters).max_lora_rank == 32
    explicit = load_settings(model_path=model, lora_adapters={"a": a}, max_lora_rank=64)
    assert with_rank(explicit, check_adapters(explicit)) is explicit


def test_an_adapter_of_another_base_is_refused(
    tmp_path: Path, make_model_dir: ModelDirFactory
) -> None:
    model = make_model_dir(BASE)
    wrong = make_adapter(tmp_path / "w", base="meta-llama/Llama-3.1-8B")
    s = load_settings(model_path=model, lora_adapters={"w": wrong})
    with pytest.raises(SettingsError, match="is an adapter of 'meta-llama/Llama-3.1-8B', not of "
                                            f"this model \\({BASE}\\)"):
        check_adapters(s)


def test_rank_above_the_setting_and_non_adapters_are_refused(
    tmp_path: Path, make_model_dir: ModelDirFactory
) -> None:
    model = make_model_dir(BASE)
    big = make_adapter(tmp_path / "big", rank=64)
    s = load_settings(model_path=model, lora_adapters={"big": big}, max_lora_rank=16)
    with pytest.raises(SettingsError, match="WORKER_MAX_LORA_RANK=16 is below the rank 64"):
        check_adapters(s)
    (tmp_path / "m").mkdir()
    write_marker(tmp_path / "m", "test", {})
    s = load_settings(model_path=model, lora_adapters={"m": tmp_path / "m"})
    with pytest.raises(SettingsError, match="is not a LoRA adapter"):
        check_adapters(s)


def test_the_launcher_rebuilds_the_command_with_the_derived_rank(
    tmp_path: Path, make_model_dir: ModelDirFactory
) -> None:
    model = make_model_dir(BASE)
    a = make_adapter(tmp_path / "a", rank=24)
    s = load_settings(model_path=model, device="cpu", lora_adapters={"a": a})
    launcher = Launcher(s, build_command(s))
    assert "--max-lora-rank" not in launcher.command.argv
    launcher.preflight()
    argv = list(launcher.command.argv)
    assert argv[argv.index("--max-lora-rank") + 1] == "32"


def test_argv_prints_the_command_run_starts_with_its_derived_rank(
    tmp_path: Path, make_model_dir: ModelDirFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_dir(BASE)
    a = make_adapter(tmp_path / "a", rank=24)
    s = load_settings(model_path=model, device="cpu", lora_adapters={"a": a})
    launcher = Launcher(s, build_command(s))
    launcher.preflight()
    assert worker_main(["argv", "--model-path", str(model), "--device", "cpu",
                        "--lora-adapters", f"a={a}"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == launcher.command.to_json_dict()
    assert printed["argv"][printed["argv"].index("--max-lora-rank") + 1] == "32"


def test_the_launcher_waits_for_every_adapter(
    tmp_path: Path, make_model_dir: ModelDirFactory
) -> None:
    model = make_model_dir(BASE)
    pending = tmp_path / "pending"
    pending.mkdir()
    s = load_settings(model_path=model, device="cpu", lora_adapters={"p": pending},
                      marker_timeout_s=0.2)
    with pytest.raises(MarkerTimeout, match=str(pending)):
        Launcher(s, build_command(s)).wait_for_markers()


def test_the_worker_refuses_a_wrong_base_in_one_line(
    tmp_path: Path, make_model_dir: ModelDirFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    model = make_model_dir(BASE)
    wrong = make_adapter(tmp_path / "w", base="Qwen2.5-7B")
    with pytest.raises(SystemExit) as exited:
        worker_main(["run", "--model-path", str(model), "--device", "cpu",
                     "--lora-adapters", f"w={wrong}"])
    assert exited.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    line = [ln for ln in err.splitlines() if ln.startswith(f"{PROG}: error: ")]
    assert line, err
    usage_error(line[-1], PROG, "is an adapter of 'Qwen2.5-7B'")
