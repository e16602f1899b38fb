"""Claims the README and docs make about the code, checked against it: the classes they name
exist, the settings they name are settings, and `make test-fast` needs no server."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from gateway.settings import GatewaySettings

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", REPO / "deploy/README.md", *sorted((REPO / "docs").glob("*.md"))]
# CamelCase names the docs take from other projects (Kubernetes and its Gateway API, Envoy,
# KEDA, locust, boto3).
FOREIGN = {"AverageValue", "FastHttpUser", "IfNotPresent", "ImmediateResponse", "InferencePool",
           "LLMInferenceService", "ReadWriteOnce", "ScaledObject", "TransferManager"}


def _python_names() -> set[str]:
    """Every word of the repository's Python: definitions, imports and strings alike (a name the
    code only decodes, such as an engine's event type, is known to it too)."""
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.split()
    names: set[str] = set()
    for path in listed:
        names.update(re.findall(r"\w+", (REPO / path).read_text(encoding="utf-8")))
    return names


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_classes_a_doc_names_exist(doc: Path) -> None:
    named = set(re.findall(r"`([A-Z][a-z]+[A-Z][A-Za-z]*)(?:\.\w+)?`", doc.read_text()))
    missing = sorted(named - FOREIGN - _python_names())
    assert not missing, (f"{doc.name} names {missing}, which the code never mentions (another "
                         "project's name? add it to FOREIGN)")


def _setting_exists(env: str) -> bool:
    model: type = GatewaySettings
    for part in env.removeprefix("GATEWAY_").lower().split("__"):
        field = model.model_fields.get(part)
        if field is None:
            return False
        model = field.annotation if isinstance(field.annotation, type) else dict
    return True


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_gateway_settings_a_doc_names_are_settings(doc: Path) -> None:
    named = set(re.findall(r"\bGATEWAY_[A-Z0-9_]+[A-Z0-9]", doc.read_text()))
    assert not sorted(n for n in named if not _setting_exists(n))
    # Constants are not settings: a doc names the env var a user can set.
    assert "`MAX_CHUNKS`" not in doc.read_text()


def test_make_test_fast_needs_no_server() -> None:
    """`make test-fast` runs without engines, chart rendering, S3, Redis, Prometheus or promtool:
    its marker expression leaves out every marker for a server the machine may lack."""
    make = (REPO / "Makefile").read_text()
    (expression,) = re.findall(r"^test-fast:.*\n\t.*-m \"([^\"]+)\"", make, re.MULTILINE)
    excluded = set(re.findall(r"not (\w+)", expression))
    markers = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    needing = {m.split(":")[0] for m in markers if ": needs" in m}
    assert needing <= excluded, f"make test-fast runs tests that need {needing - excluded}"
    assert "slow" in excluded


# A path in the repository: a top-level directory of it, then a file name with its extension.
_TOP = "|".join(sorted(p.name for p in REPO.iterdir() if p.is_dir() and not p.name.startswith(".")))
_PATH = re.compile(rf"(?<![\w/.-])((?:{_TOP})/[\w./-]*\w\.(?:py|md|yaml|json|tpl|txt|sh|toml))\b")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_the_files_a_doc_names_exist(doc: Path) -> None:
    listed = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                                check=True).stdout.split())
    named = set(_PATH.findall(doc.read_text()))
    assert not sorted(named - listed), f"{doc.name} names files the repository does not hold"


def _targets(makefile: str) -> set[str]:
    return set(re.findall(r"^([\w-]+):", (REPO / makefile).read_text(), re.MULTILINE))


@pytest.mark.parametrize("doc", [*DOCS, REPO / "Makefile"], ids=lambda p: str(p.relative_to(REPO)))
def test_the_make_targets_a_doc_names_exist(doc: Path) -> None:
    """`make X` is a target of the Makefile, `make -f deploy/Makefile X` one of deploy/Makefile."""
    text = doc.read_text()
    named = {("Makefile", t) for t in re.findall(r"(?:`|^|# )make (\w[\w-]*)", text, re.MULTILINE)}
    named |= set(re.findall(r"make -f ([\w/]*Makefile) (\w[\w-]*)", text))
    missing = sorted(f"{m} {t}" for m, t in named if t not in _targets(m))
    assert not missing, f"{doc.name} names make targets their Makefile lacks"
