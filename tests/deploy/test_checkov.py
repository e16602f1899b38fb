"""checkov on every rendered case and on the Dockerfiles: no finding except the waived ones.

checkov runs through deploy/checkov.sh, which creates its own virtualenv (.venv-checkov) on first
use: its resolver fights the project's pins, so it is not in the project's venv.

The brief is "no HIGH findings". Open-source checkov reports no severities (they come from its
hosted service, which is not reachable here: every `severity` in its JSON is null), so every
finding counts as high unless deploy/checkov-waivers.yaml lists it with the reason (the README
lists them too). A waiver that no longer matches anything fails as well: it would hide a future
regression for no present reason.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import REPO
from tests.deploy.render_for_scan import write_cases

pytestmark = pytest.mark.helm

SCRIPT = REPO / "deploy" / "checkov.sh"
WAIVERS = REPO / "deploy" / "checkov-waivers.yaml"
README = REPO / "deploy" / "README.md"
DOCKERFILES = REPO / "deploy" / "docker"


def run_checkov(args: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [str(SCRIPT), *args, "--output", "json", "--quiet", "--compact"],
        capture_output=True,
        text=True,
        # The first run also creates checkov's virtualenv (pip install, about a minute).
        timeout=900,
        check=False,
    )
    # Exit 1 means "findings"; anything else is the script or checkov itself failing.
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
    write_cases(out)
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


def test_waivers_are_recorded_in_the_readme() -> None:
    readme = README.read_text(encoding="utf-8")
    missing = [w["check"] for w in waivers() if w["check"] not in readme]
    assert missing == [], f"deploy/README.md does not explain waivers {missing}"
