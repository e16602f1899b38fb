from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.cli import run_main
from worker.__main__ import main
from worker.settings import WorkerSettings

if TYPE_CHECKING:
    from tests.worker.conftest import Spawner

ModelDirFactory = Callable[..., Path]
REPO = Path(__file__).resolve().parents[2]


def run_worker(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "worker", *args],
        cwd=REPO,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_help_documents_every_setting() -> None:
    done = run_main(main, "--help")
    assert done.returncode == 0
    for field, info in WorkerSettings.model_fields.items():
        assert "--" + field.replace("_", "-") in done.stdout
        assert info.description and info.description.split()[0] in done.stdout
    # The env var of each flag follows one rule, stated once.
    assert "(``WORKER_TENSOR_PARALLEL_SIZE=2``); flags win" in done.stdout


def test_flags_override_env(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    make_model_dir: ModelDirFactory,
) -> None:
    monkeypatch.setenv("WORKER_MODEL_PATH", str(make_model_dir()))
    monkeypatch.setenv("WORKER_PORT", "9000")
    assert main(["argv", "--port", "9100"]) == 0
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert argv[argv.index("--port") + 1] == "9100"


def test_arguments_after_double_dash_are_passed_to_vllm(
    capsys: pytest.CaptureFixture[str], make_model_dir: ModelDirFactory,
) -> None:
    model = str(make_model_dir())
    assert (
        main(["argv", "--model-path", model, "--extra-args=--seed 7", "--", "--enforce-eager"])
        == 0
    )
    argv = json.loads(capsys.readouterr().out)["argv"]
    assert argv[-3:] == ["--seed", "7", "--enforce-eager"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("argv",), "llmserve-worker: error: WORKER_MODEL_PATH is required"),
        (
            ("argv", "--model-path", "/m", "--nnodes", "two"),
            "llmserve-worker: error: WORKER_NNODES: Input should be",
        ),
        (
            ("argv", "--model-path", "/m", "--device", "tpu"),
            "llmserve-worker: error: WORKER_DEVICE: Input should be 'gpu' or 'cpu'",
        ),
        (
            ("argv", "--model-path", "/m", "--no-such-flag", "1"),
            "llmserve-worker: error: unrecognized arguments",
        ),
        (
            ("badmode",),
            ("llmserve-worker: error: argument mode: invalid choice: 'badmode' (choose from "
             "'run', 'argv', 'plan')"),
        ),
    ],
)
def test_bad_settings_exit_2_with_one_line(args: tuple[str, ...], message: str) -> None:
    done = run_main(main, *args)
    assert done.returncode == 2
    assert done.stderr.startswith(message)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr


def test_layout_that_does_not_fit_the_model_exits_2(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(heads=9, kv_heads=3)
    done = run_worker("--model-path", str(model), "--device", "cpu", "--tensor-parallel-size", "2")
    assert done.returncode == 2
    assert done.stderr.splitlines()[-1].startswith(
        "llmserve-worker: error: WORKER_TENSOR_PARALLEL_SIZE=2: TP=2 does not divide 9 attention "
        f"heads of {model}/config.json; nearest valid: 1, 3"
    )


@pytest.mark.parametrize(("mode", "args", "message"), [
    *((mode, ("--tensor-parallel-size", "3"),
       "WORKER_TENSOR_PARALLEL_SIZE=3: TP=3 does not divide 32 attention heads")
      for mode in ("run", "argv")),
    *((mode, ("--max-model-len", "9000"),
       "WORKER_MAX_MODEL_LEN=9000 exceeds the model's maximum 8192") for mode in ("run", "argv")),
    # `run` waits for a model that is not there yet (its marker); `argv` cannot wait.
    ("argv", ("--model-path", "/nonexistent/model"),
     "WORKER_MODEL_PATH=/nonexistent/model: cannot read"),
])
def test_argv_refuses_what_run_refuses(
    make_model_dir: ModelDirFactory, mode: str, args: tuple[str, ...], message: str,
) -> None:
    """`argv` prints only a command `run` would start: the same checks, the same one line."""
    model = make_model_dir("Llama", heads=32, kv_heads=8, layers=32)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 8192}))
    done = run_main(main, mode, "--model-path", str(model), "--device", "cpu", *args)
    assert done.returncode == 2
    assert done.stderr.startswith(f"llmserve-worker: error: {message}"), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_incomplete_model_times_out_with_exit_1(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(complete=False)
    done = run_worker("--model-path", str(model), "--device", "cpu", "--marker-timeout-s", "0.5")
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert last.startswith(f"llmserve-worker: error: model directory {model} is not complete")
    assert "Traceback" not in done.stderr


def test_sigterm_while_waiting_for_the_model_starts_nothing(
    make_model_dir: ModelDirFactory, spawner: Spawner
) -> None:
    model = make_model_dir(complete=False)
    worker = spawner.start(
        [sys.executable, "-m", "worker", "--model-path", str(model), "--device", "cpu"],
        stderr=subprocess.PIPE,
    )
    assert worker.stderr is not None
    assert "waiting for the completion marker" in worker.stderr.readline()
    worker.send_signal(signal.SIGTERM)
    _, stderr = worker.communicate(timeout=20)
    assert worker.returncode == 128 + signal.SIGTERM
    assert "not starting vLLM" in stderr
