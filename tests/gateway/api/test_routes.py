"""/v1/models shows live replicas per model and the layout the deployment declared."""

from __future__ import annotations

import httpx
import pytest
from pydantic import ValidationError

from gateway.settings import GatewaySettings
from tests.gateway.conftest import UpstreamFactory, run_gateway, url_of


def test_models_carry_replicas_and_declared_layouts(upstreams: UpstreamFactory) -> None:
    tp1, tp2, pp = upstreams(model="m-tp"), upstreams(model="m-tp"), upstreams(model="m-pp")
    layouts = {"m-pp": {"tp": 1, "pp": 2, "nodes": 2}}
    with run_gateway(backends=[url_of(tp1), url_of(tp2), url_of(pp)],
                     model_layouts=layouts) as gw:
        data = {m["id"]: m for m in httpx.get(gw.url + "/v1/models").json()["data"]}
    assert data["m-tp"]["llmserve"] == {"replicas": 2}  # no layout declared: replicas only
    assert data["m-pp"]["llmserve"] == {"replicas": 1, "tp": 1, "pp": 2, "nodes": 2}
    assert data["m-pp"]["object"] == "model"


def test_layout_errors_name_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GATEWAY_MODEL_LAYOUTS", '{"m": {"tp": 0}}')
    with pytest.raises(ValidationError, match="model_layouts"):
        GatewaySettings()
