"""docs/settings.md, the reference of every gateway and worker setting, is generated from the
settings classes: it names every setting with its default, and it is not stale."""

from __future__ import annotations

from pathlib import Path

import pytest

from deploy import settings_doc
from gateway.settings import GatewaySettings
from worker.settings import WorkerSettings


def test_the_page_is_what_the_code_says() -> None:
    assert settings_doc.main(["--check"]) == 0, "run python -m deploy.settings_doc"


def test_a_stale_page_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "settings.md"
    page.write_text(settings_doc.render().replace("`8000`", "`8080`", 1))
    monkeypatch.setattr(settings_doc, "OUT", page)
    assert settings_doc.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err
    assert settings_doc.main([]) == 0 and settings_doc.main(["--check"]) == 0


@pytest.mark.parametrize(("model", "prefix", "examples"), [
    (GatewaySettings, "GATEWAY_", {"GATEWAY_DNS_INTERVAL_S": "5.0",
                                   "GATEWAY_FLOW__KV_CACHE_HIGH": "0.95",
                                   "GATEWAY_LORA__LOAD_TIMEOUT_S": "60.0"}),
    (WorkerSettings, "WORKER_", {"WORKER_MARKER_TIMEOUT_S": "1800.0",
                                 "WORKER_LAUNCHER": '"auto"'}),
])
def test_every_setting_is_on_the_page(model: type, prefix: str, examples: dict[str, str]) -> None:
    page = settings_doc.render()
    rows = {line.split("`")[1]: line.split("`")[3] for line in page.splitlines()
            if line.startswith(f"| `{prefix}")}
    top = {f"{prefix}{name.upper()}" for name in model.model_fields}
    # Every top-level field is a row, or the prefix of its nested rows.
    assert all(any(r == t or r.startswith(t + "__") for r in rows) for t in top)
    for env, default in examples.items():
        assert rows[env] == default
    # Each says what it is for (issue 37, item 17: a setting nobody sets is documented).
    meaning = {line.split("`")[1]: line.rsplit("|", 2)[1].strip() for line in page.splitlines()
               if line.startswith(f"| `{prefix}")}
    assert not [env for env, text in meaning.items() if not text]
