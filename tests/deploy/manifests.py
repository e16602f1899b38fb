"""Render the chart through Helm's Go SDK (helm-python-sdk) and walk what it produced.

`render()` returns a `Release`: every manifest as a dict, plus NOTES.txt. `pod_templates()` finds
every pod the release would run (Deployment, StatefulSet, Job, both LeaderWorkerSet templates) so
the invariant tests look at all of them, whatever kind owns them.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "llmserve"
PRESETS = sorted(CHART.glob("values-*.yaml"))
RELEASE = "llm"
NAMESPACE = "inference"
# The registry the tests render the chart with: the chart requires one (no published images).
TEST_REGISTRY = "registry.example.com/ml"

Manifest = dict[str, Any]

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Pod:
    """One pod template: who owns it, in which role, and its spec."""

    owner: Manifest
    role: str  # "gateway", "single", "leader", "follower", "fetch", "minio"
    metadata: Manifest
    spec: Manifest

    @property
    def name(self) -> str:
        return f"{self.owner['kind']}/{self.owner['metadata']['name']}[{self.role}]"

    def containers(self, init: bool = True) -> list[Manifest]:
        found = list(self.spec.get("containers", []))
        return found + list(self.spec.get("initContainers", [])) if init else found

    def container(self, name: str) -> Manifest:
        for c in self.containers():
            if c["name"] == name:
                return c
        raise KeyError(f"{self.name} has no container {name!r}")

    def anti_affinity(self) -> list[Manifest]:
        """The pod's required anti-affinity terms (what keeps its kind off one node)."""
        return list(self.spec.get("affinity", {}).get("podAntiAffinity", {})
                    .get("requiredDuringSchedulingIgnoredDuringExecution", []))


@dataclass(frozen=True)
class Release:
    values: Mapping[str, Any]
    manifests: list[Manifest]
    notes: str

    def of_kind(self, kind: str) -> list[Manifest]:
        return [m for m in self.manifests if m["kind"] == kind]

    def one(self, kind: str, name: str | None = None) -> Manifest:
        found = [m for m in self.of_kind(kind) if name is None or m["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
        return found[0]

    def pods(self) -> Iterator[Pod]:
        for m in self.manifests:
            yield from _pods_of(m)

    def worker_pods(self) -> list[Pod]:
        return [p for p in self.pods() if p.role in ("single", "leader", "follower")]


def _pods_of(m: Manifest) -> Iterator[Pod]:
    kind = m["kind"]
    if kind == "LeaderWorkerSet":
        lwt = m["spec"]["leaderWorkerTemplate"]
        for role, key in (("leader", "leaderTemplate"), ("follower", "workerTemplate")):
            tpl = lwt[key]
            yield Pod(m, role, tpl["metadata"], tpl["spec"])
    elif kind in ("Deployment", "StatefulSet", "Job"):
        tpl = m["spec"]["template"]
        labels = tpl["metadata"]["labels"]
        component = labels.get("app.kubernetes.io/component")
        role = labels.get("llmserve.io/role") or {"model-fetch": "fetch"}.get(component, component)
        yield Pod(m, role, tpl["metadata"], tpl["spec"])


def load_values(path: Path) -> dict[str, Any]:
    data = yaml.load(path.read_text(encoding="utf-8"), Loader=_Loader)
    return data or {}


def chart() -> helm_python.Chart:
    return helm_python.Chart.load(CHART)


def with_registry(values: Mapping[str, Any], registry: str = TEST_REGISTRY) -> dict[str, Any]:
    """The values with image.registry set, unless they set it themselves."""
    out = copy.deepcopy(dict(values))
    image = out.setdefault("image", {})
    image.setdefault("registry", registry)
    return out


def render(
    values: Mapping[str, Any] | None = None,
    *,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    loaded: helm_python.Chart | None = None,
    registry: str | None = TEST_REGISTRY,
) -> Release:
    """Render like `helm template`: schema validation, then every template. image.registry, which
    the chart requires, is `registry` unless the values set it (None: left out)."""
    given = dict(values or {})
    c = loaded or chart()
    try:
        out = c.render(with_registry(given, registry) if registry is not None else copy.deepcopy(given),
                       name=name, namespace=namespace)
    finally:
        if loaded is None:
            c.close()
    manifests: list[Manifest] = []
    notes = ""
    for path, text in sorted(out.items()):
        if path.endswith("NOTES.txt"):
            notes = text
            continue
        manifests += [d for d in yaml.load_all(text, Loader=_Loader) if d]
    return Release(values=values or {}, manifests=manifests, notes=notes)


def env_of(container: Manifest) -> dict[str, str]:
    """Literal env values (valueFrom entries are left out)."""
    return {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}


def selector_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())
