"""HTTP from the tests to the servers they start on loopback: httpx's own calls and clients, with
one TLS context for the whole run.

httpx builds a TLS context from the CA bundle for every client it makes, each `httpx.get` and
`httpx.post` included: tens of milliseconds of CPU each, most of a short gateway test's time, and
none of these URLs is https. Here the context is built once and handed to httpx (`verify=`, its
public way to bring one's own); requests are otherwise exactly httpx's.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import httpx

TLS = httpx.create_ssl_context()


def get(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.get(url, verify=TLS, **kwargs)


def post(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(url, verify=TLS, **kwargs)


def delete(url: str, **kwargs: Any) -> httpx.Response:
    return httpx.delete(url, verify=TLS, **kwargs)


def request(method: str, url: str, **kwargs: Any) -> httpx.Response:
    return httpx.request(method, url, verify=TLS, **kwargs)


def stream(method: str, url: str, **kwargs: Any) -> AbstractContextManager[httpx.Response]:
    return httpx.stream(method, url, verify=TLS, **kwargs)


def client(**kwargs: Any) -> httpx.Client:
    return httpx.Client(verify=TLS, **kwargs)


def async_client(**kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=TLS, **kwargs)
