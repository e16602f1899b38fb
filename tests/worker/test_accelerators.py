from __future__ import annotations

import pytest

from worker.accelerators import check_accelerators, detect_gpus, pod_accelerators
from worker.settings import SettingsError, load_settings

TWO_GPUS = "GPU 0: NVIDIA A100 (UUID: GPU-a)\nGPU 1: NVIDIA A100 (UUID: GPU-b)\n"


def no_nvidia_smi() -> str | None:
    return None


@pytest.mark.parametrize(
    ("env", "listing", "expected"),
    [
        ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, TWO_GPUS, 4),
        ({"CUDA_VISIBLE_DEVICES": ""}, TWO_GPUS, 0),
        ({"NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c"}, None, 3),
        ({"NVIDIA_VISIBLE_DEVICES": "all"}, TWO_GPUS, 2),
        ({}, TWO_GPUS, 2),
        ({}, None, None),
    ],
)
def test_detect_gpus(env: dict[str, str], listing: str | None, expected: int | None) -> None:
    assert detect_gpus(env, lambda: listing) == expected


def test_explicit_count_wins_over_detection() -> None:
    s = load_settings(model_path="/m", accelerators=8)
    assert pod_accelerators(s, {"CUDA_VISIBLE_DEVICES": "0"}, no_nvidia_smi) == 8


def test_cpu_is_not_detected() -> None:
    s = load_settings(model_path="/m", device="cpu")
    assert pod_accelerators(s, {"CUDA_VISIBLE_DEVICES": "0,1"}, lambda: TWO_GPUS) is None


def test_matching_layout_passes() -> None:
    # TP 2 x (PP 4 / 2 nodes) = 4 GPUs per pod.
    s = load_settings(
        model_path="/m",
        tensor_parallel_size=2,
        pipeline_parallel_size=4,
        nnodes=2,
        master_addr="leader",
    )
    check_accelerators(s, 4)
    check_accelerators(s, None)


@pytest.mark.parametrize("available", [2, 8])
def test_mismatch_names_the_settings(available: int) -> None:
    s = load_settings(
        model_path="/m",
        tensor_parallel_size=2,
        pipeline_parallel_size=4,
        nnodes=2,
        master_addr="leader",
    )
    with pytest.raises(SettingsError) as caught:
        check_accelerators(s, available)
    assert str(caught.value) == (
        "WORKER_TENSOR_PARALLEL_SIZE=2 x 2 pipeline stage(s) per node "
        "(WORKER_PIPELINE_PARALLEL_SIZE=4 / WORKER_NNODES=2) needs 4 accelerator(s) but this pod "
        f"has {available} (WORKER_ACCELERATORS or detected)"
    )
