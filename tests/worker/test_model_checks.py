from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from worker.model_checks import ModelShape, check_layout, read_model_shape
from worker.settings import SettingsError, load_settings

ModelDirFactory = Callable[..., Path]


def test_reads_the_shape_from_config_json(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(heads=9, kv_heads=3, layers=30)
    assert read_model_shape(model) == ModelShape(model / "config.json", 9, 3, 30)


def test_kv_heads_default_to_attention_heads(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(
        json.dumps({"num_attention_heads": 8, "num_hidden_layers": 4}), encoding="utf-8"
    )
    assert read_model_shape(tmp_path).num_key_value_heads == 8


def test_multimodal_text_config_is_used(tmp_path: Path) -> None:
    text = {"num_attention_heads": 16, "num_key_value_heads": 4, "num_hidden_layers": 12}
    (tmp_path / "config.json").write_text(json.dumps({"text_config": text}), encoding="utf-8")
    assert read_model_shape(tmp_path) == ModelShape(tmp_path / "config.json", 16, 4, 12)


@pytest.mark.parametrize("tp", [1, 3])
def test_valid_layouts_pass(make_model_dir: ModelDirFactory, tp: int) -> None:
    shape = read_model_shape(make_model_dir())
    check_layout(
        load_settings(model_path="/m", tensor_parallel_size=tp, pipeline_parallel_size=30), shape
    )


def test_tp_must_divide_attention_heads(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(heads=9, kv_heads=3)
    with pytest.raises(SettingsError) as caught:
        check_layout(
            load_settings(model_path=model, tensor_parallel_size=2), read_model_shape(model)
        )
    assert str(caught.value) == (
        f"WORKER_TENSOR_PARALLEL_SIZE=2: TP=2 does not divide 9 attention heads of "
        f"{model}/config.json; nearest valid: 1, 3"
    )


def test_tp_above_the_kv_heads_replicates_them(make_model_dir: ModelDirFactory) -> None:
    # vLLM replicates KV heads when TP exceeds them: TP=4 with 2 KV heads is valid (two ranks
    # share each head), as is TP=16 with 8. The old check refused these.
    for heads, kv, tp in ((8, 2, 4), (64, 8, 16), (32, 8, 32)):
        model = make_model_dir(name=f"m{tp}", heads=heads, kv_heads=kv)
        check_layout(
            load_settings(model_path=model, tensor_parallel_size=tp), read_model_shape(model)
        )


def test_tp_and_kv_heads_must_divide_one_another(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(heads=12, kv_heads=4)
    with pytest.raises(SettingsError) as caught:
        check_layout(
            load_settings(model_path=model, tensor_parallel_size=6), read_model_shape(model)
        )
    message = str(caught.value)
    assert "TP=6 and 4 KV heads do not divide one another" in message
    assert message.endswith("nearest valid: 4, 12")


def test_pp_cannot_exceed_layers(make_model_dir: ModelDirFactory) -> None:
    model = make_model_dir(layers=4)
    with pytest.raises(
        SettingsError, match="WORKER_PIPELINE_PARALLEL_SIZE=5 exceeds num_hidden_layers=4"
    ):
        check_layout(
            load_settings(model_path=model, pipeline_parallel_size=5), read_model_shape(model)
        )


def test_missing_config_names_the_model_path(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match=f"WORKER_MODEL_PATH={tmp_path}: cannot read"):
        read_model_shape(tmp_path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[]", "is not a JSON object"),
        (
            '{"num_attention_heads": 8, "num_hidden_layers": "many"}',
            "no positive integer 'num_hidden_layers'",
        ),
    ],
)
def test_malformed_config(tmp_path: Path, content: str, message: str) -> None:
    (tmp_path / "config.json").write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match=message):
        read_model_shape(tmp_path)


def test_max_model_len_above_the_models_maximum_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = {"num_attention_heads": 8, "num_hidden_layers": 4, "max_position_embeddings": 4096}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    shape = read_model_shape(tmp_path)
    check_layout(load_settings(model_path=tmp_path, max_model_len=4096), shape)
    with pytest.raises(SettingsError) as caught:
        check_layout(load_settings(model_path=tmp_path, max_model_len=4097), shape)
    assert str(caught.value) == (
        f"WORKER_MAX_MODEL_LEN=4097 exceeds the model's maximum 4096 (max_position_embeddings of "
        f"{tmp_path}/config.json), which vLLM refuses (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 lets vLLM "
        "take it)"
    )
    # vLLM's own switch lifts its check, and so this one.
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    check_layout(load_settings(model_path=tmp_path, max_model_len=4097), shape)


def test_latent_attention_counts_as_one_kv_head(tmp_path: Path) -> None:
    config = {"num_attention_heads": 128, "num_key_value_heads": 128, "num_hidden_layers": 61,
              "kv_lora_rank": 512}
    (tmp_path / "config.json").write_text(json.dumps(config), encoding="utf-8")
    shape = read_model_shape(tmp_path)
    assert shape.num_key_value_heads == 1
    check_layout(load_settings(model_path=tmp_path, tensor_parallel_size=16), shape)
