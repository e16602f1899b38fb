"""The gateway against its own OpenAPI document (gateway/api/openapi.py), with schemathesis:
generated requests to every operation through a real gateway in front of the fake upstream. No
answer may be a server error (5xx other than the documented upstream ones), and every status,
content type and body must be the documented ones. Bounded: a fixed number of examples per
operation, no shrinking deadline."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

from bench.fake_upstream import Behaviour, start_in_thread
from gateway.api.openapi import openapi_schema
from tests import loopback
from tests.gateway.conftest import run_gateway, url_of


@pytest.fixture(scope="module")
def gateway_url() -> Iterator[str]:
    # Generated max_tokens can be huge: answers stop at 16 tokens, as at an engine's context end.
    with start_in_thread(Behaviour(tokens=4, max_answer_tokens=16)) as up, \
            run_gateway(backends=[url_of(up)], max_body_bytes=64 * 1024) as gw:
        yield gw.url


def served_document() -> dict[str, Any]:
    """The document, narrowed to what this test's upstream serves: the one model."""
    served = copy.deepcopy(openapi_schema("llmserve gateway", "0.1.0"))
    for path in ("/v1/chat/completions", "/v1/completions"):
        body = served["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        props = body["schema"]["properties"]
        props["model"] = {**props["model"], "enum": ["demo", "", None]}
    return served


# Loaded here, not from a fixture: schemathesis' lazy fixture loader breaks on pytest 9
# ('Function' object has no attribute '_nodeid'); the base URL comes per call instead.
schema = schemathesis.openapi.from_dict(served_document())


def test_the_gateway_serves_this_document(gateway_url: str) -> None:
    app_doc = loopback.get(gateway_url + "/openapi.json").json()
    assert app_doc == openapi_schema(app_doc["info"]["title"], app_doc["info"]["version"])


@schema.parametrize()
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_gateway_conforms_to_its_openapi_document(case: Any, gateway_url: str) -> None:
    # The document says what the gateway reads (model, stream), not all the engine accepts: a
    # body the document allows may still be the engine's 400 (relayed; documented), so a 400 for
    # a "valid" body is no failure here. Every other check holds.
    case.call_and_validate(base_url=gateway_url, excluded_checks=[positive_data_acceptance])
