"""Every preset and values case of the chart tests, rendered into files a scanner reads.

`python -m tests.deploy.render_for_scan DIR` writes one YAML file per case (deploy/checkov.sh runs
it when called without arguments); tests/deploy/test_checkov.py calls `write_cases` itself.
Scanners such as checkov know no LeaderWorkerSet, so its two pod templates are added as Pods.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from tests.deploy.conftest import ALL_CASES
from tests.deploy.manifests import Manifest, render


def scannable(manifests: list[Manifest]) -> list[Manifest]:
    """The manifests, plus each LeaderWorkerSet's leader and follower templates as Pods."""
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


def case_file_name(case: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", case.lower()) + ".yaml"


def write_cases(out: Path) -> dict[str, Path]:
    """Render every case into OUT; returns case -> file."""
    out.mkdir(parents=True, exist_ok=True)
    files: dict[str, Path] = {}
    for case, values in ALL_CASES.items():
        path = out / case_file_name(case)
        docs = scannable(render(values).manifests)
        path.write_text(yaml.safe_dump_all(docs, sort_keys=False), encoding="utf-8")
        files[case] = path
    return files


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.deploy.render_for_scan DIR", file=sys.stderr)
        return 2
    files = write_cases(Path(argv[0]))
    print(f"rendered {len(files)} cases into {argv[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
