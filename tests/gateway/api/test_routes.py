"""/v1/models shows live replicas per model and the layout the deployment declared."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from tests import loopback
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of


def test_models_carry_replicas_and_declared_layouts(upstreams: UpstreamFactory) -> None:
    tp1, tp2, pp = upstreams(model="m-tp"), upstreams(model="m-tp"), upstreams(model="m-pp")
    layouts = [{"name": "pp", "model": "m-pp", "tp": 1, "pp": 2, "nodes": 2},
               # Two pools of one name with different layouts: no one layout to show.
               {"name": "a", "model": "m-tp", "tp": 2}, {"name": "b", "model": "m-tp", "tp": 4}]
    with run_gateway(backends=[url_of(tp1), url_of(tp2), url_of(pp)],
                     pools=layouts) as gw:
        data = {m["id"]: m for m in loopback.get(gw.url + "/v1/models").json()["data"]}
    assert data["m-tp"]["llmserve"] == {"replicas": 2}  # no one layout: replicas only
    assert data["m-pp"]["llmserve"] == {"replicas": 1, "tp": 1, "pp": 2, "nodes": 2}
    assert data["m-pp"]["object"] == "model"
    # The engine's own card, every field of it (clients size prompts from max_model_len).
    assert {k: v for k, v in data["m-pp"].items() if k != "llmserve"} == {
        "id": "m-pp", "object": "model", "created": 1, "owned_by": "fake", "root": "m-pp",
        "parent": None, "max_model_len": 4096}


def test_layout_errors_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_POOLS", '[{"name": "p", "model": "m", "tp": 0}]')
    with pytest.raises(ValidationError, match="pools"):
        GatewaySettings()
