"""checkov on every rendered case and on the Dockerfiles: no finding except the waived ones.

Open-source checkov reports no severities (they come from its hosted service, which is not
reachable here), so no finding of ANY severity is let through unless deploy/checkov-waivers.yaml
lists it with the reason. A waiver that no longer matches anything fails too: it would hide a
future regression for no present reason.

checkov runs from its own virtualenv (its resolver fights the project's pins): `make -f
deploy/Makefile checkov-venv`, or point LLMSERVE_CHECKOV at a checkov executable.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.conftest import ALL_CASES
from tests.deploy.manifests import REPO, Manifest, render

pytestmark = pytest.mark.helm

WAIVERS = REPO / "deploy" / "checkov-waivers.yaml"
DOCKERFILES = REPO / "deploy" / "docker"
DEFAULT_CHECKOV = REPO / ".venv-checkov" / "bin" / "checkov"


def checkov() -> str:
    path = Path(os.environ.get("LLMSERVE_CHECKOV") or DEFAULT_CHECKOV)
    assert path.exists(), f"{path} not found: run `make -f deploy/Makefile checkov-venv`"
    return str(path)


def scannable(manifests: list[Manifest]) -> list[Manifest]:
    """checkov has no LeaderWorkerSet checks: hand it the LWS pod templates as Pods."""
    out: list[Manifest] = []
    for m in manifests:
        out.append(m)
        if m["kind"] == "LeaderWorkerSet":
            lwt = m["spec"]["leaderWorkerTemplate"]
            for role, key in (("leader", "leaderTemplate"), ("follower", "workerTemplate")):
                meta = {
                    **lwt[key]["metadata"],
                    "name": f"{m['metadata']['name']}-{role}",
                    "namespace": m["metadata"]["namespace"],
                }
                out.append(
                    {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": lwt[key]["spec"]}
                )
    return out


def run_checkov(args: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [checkov(), *args, "--output", "json", "--quiet", "--compact", "--skip-download"],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "BC_SKIP_MAPPING": "TRUE", "CHECKOV_RUN_SCA_PACKAGE_SCAN_V2": "false"},
    )
    # Exit 1 means "findings"; anything else is checkov itself failing.
    assert done.returncode in (0, 1), done.stderr[-2000:]
    reports = json.loads(done.stdout) if done.stdout.strip() else []
    reports = reports if isinstance(reports, list) else [reports]
    failed: list[dict[str, Any]] = []
    for report in reports:
        assert report["summary"]["parsing_errors"] == 0, report["summary"]
        assert report["summary"]["passed"] > 0
        failed += report["results"]["failed_checks"]
    return failed


@pytest.fixture(scope="module")
def findings(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[str, str, str]]:
    """(check id, resource, scanned case) for every failed check."""
    out = tmp_path_factory.mktemp("rendered")
    for case, values in ALL_CASES.items():
        docs = scannable(render(values).manifests)
        name = re.sub(r"[^a-z0-9-]+", "-", case.lower())
        (out / f"{name}.yaml").write_text(
            yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8"
        )
    rows = []
    for f in run_checkov(["--directory", str(out), "--framework", "kubernetes"]):
        rows.append((f["check_id"], f["resource"], Path(f["file_path"]).stem))
    for f in run_checkov(["--directory", str(DOCKERFILES), "--framework", "dockerfile"]):
        rows.append((f["check_id"], f["resource"], "dockerfile"))
    return rows


def waivers() -> list[dict[str, str]]:
    data = yaml.safe_load(WAIVERS.read_text(encoding="utf-8"))
    entries: list[dict[str, str]] = data["waivers"]
    for w in entries:
        assert set(w) == {"check", "resources", "reason"} and len(w["reason"]) > 40, w
    return entries


def _waived(check: str, resource: str, entries: list[dict[str, str]]) -> dict[str, str] | None:
    for w in entries:
        if w["check"] == check and re.fullmatch(w["resources"], resource):
            return w
    return None


def test_no_unwaived_findings(findings: list[tuple[str, str, str]]) -> None:
    entries = waivers()
    open_findings = sorted({(c, r, case) for c, r, case in findings if not _waived(c, r, entries)})
    assert open_findings == [], "\n".join(f"{c} {r} ({case})" for c, r, case in open_findings)


def test_every_waiver_is_still_needed(findings: list[tuple[str, str, str]]) -> None:
    entries = waivers()
    used = {id(w) for c, r, _ in findings if (w := _waived(c, r, entries)) is not None}
    stale = [f"{w['check']} {w['resources']}" for w in entries if id(w) not in used]
    assert stale == [], f"stale waivers: {stale}"
