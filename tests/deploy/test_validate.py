"""Every rendered manifest validates: built-in kinds against the Kubernetes JSON schemas
(kubernetes-validate, strict: unknown fields are errors) for the oldest and newest Kubernetes the
chart supports; custom resources against the upstream CRD schemas vendored in
deploy/schemas/crds/ (source, version and licence in the README there).

A CRD's openAPIV3Schema does not forbid unknown fields: the API server prunes them silently, so a
misspelt field would vanish without a word. The conversion below closes every object that does
not say x-kubernetes-preserve-unknown-fields, so such a field fails here instead.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import pytest
import yaml

from tests.deploy.manifests import REPO, Manifest, Release

pytestmark = pytest.mark.helm

KUBE_VERSIONS = ("1.29.0", "1.37.0")
CRD_DIR = REPO / "deploy" / "schemas" / "crds"
CRD_GROUPS = ("leaderworkerset.x-k8s.io", "monitoring.coreos.com", "keda.sh",
              "inference.networking.k8s.io", "gateway.networking.k8s.io")


def _closed(node: Any) -> Any:
    """openAPIV3Schema -> JSON schema (draft 4) that rejects unknown fields."""
    if isinstance(node, list):
        return [_closed(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable"):
        out.pop("nullable")
        if "type" in out:
            out["type"] = [out["type"], "null"]
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    # Property *names* are not schemas: leave them alone, but convert their values.
    if "properties" in node:
        out["properties"] = {k: _closed(v) for k, v in node["properties"].items()}
    return out


@functools.cache
def crd_validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    validators: dict[tuple[str, str], jsonschema.Draft4Validator] = {}
    for path in sorted(Path(CRD_DIR).glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = crd["spec"]
        for version in spec["versions"]:
            schema = _closed(version["schema"]["openAPIV3Schema"])
            # metadata is the API server's ObjectMeta; only the shape matters here.
            schema["properties"]["metadata"] = {"type": "object"}
            api_version = f"{spec['group']}/{version['name']}"
            validators[(api_version, spec["names"]["kind"])] = jsonschema.Draft4Validator(schema)
    return validators


def is_custom(m: Manifest) -> bool:
    return str(m["apiVersion"]).split("/")[0] in CRD_GROUPS


def test_crd_schemas_are_there() -> None:
    kinds = {kind for _, kind in crd_validators()}
    assert {"LeaderWorkerSet", "ServiceMonitor", "PodMonitor", "PrometheusRule",
            "ScaledObject", "InferencePool", "HTTPRoute"} <= kinds


def test_crd_conversion_rejects_an_unknown_field() -> None:
    """The closed schema is what makes the CRD validation worth something."""
    lws: dict[str, Any] = {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "x"},
        "spec": {
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": {"containers": []}}}
        },
    }
    validator = crd_validators()[("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet")]
    validator.validate(lws)
    lws["spec"]["leaderWorkerTemplate"]["sise"] = 2
    with pytest.raises(jsonschema.ValidationError, match="sise"):
        validator.validate(lws)


@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_builtin_kinds_match_the_kubernetes_schemas(release: Release, kube_version: str) -> None:
    for m in release.manifests:
        if is_custom(m):
            continue
        try:
            kubernetes_validate.validate(m, kube_version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(
                f"{m['kind']}/{m['metadata']['name']} @ {kube_version}: {exc.message} "
                f"at {list(exc.absolute_path)}"
            )


def test_custom_resources_match_their_crds(release: Release) -> None:
    for m in release.manifests:
        if not is_custom(m):
            continue
        validator = crd_validators().get((m["apiVersion"], m["kind"]))
        assert validator is not None, f"no CRD schema for {m['apiVersion']} {m['kind']}"
        errors = sorted(validator.iter_errors(m), key=lambda e: list(e.absolute_path))
        assert not errors, "\n".join(
            f"{m['kind']}/{m['metadata']['name']}: {e.message} at {list(e.absolute_path)}"
            for e in errors
        )
