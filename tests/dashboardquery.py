"""Run a dashboard's queries on a real Prometheus the way Grafana would: resolve its template
variables from the series (chained ones see the earlier values), substitute, query."""

from __future__ import annotations

from typing import Any

from deploy.dashboards.common import Dashboard, Panel, substitute, variable_source
from tests.prometheusserver import PrometheusServer

ALL = ".*"  # Grafana's "All" for the multi-value variables (their allValue)


def resolve(prom: PrometheusServer, d: Dashboard, start: float, end: float,
            preferred: dict[str, str], rate_interval: str) -> dict[str, str]:
    """Each template variable's value: a constant's own; otherwise `preferred`'s, which must be
    among the label values of its selector over [start, end], or All. A hidden variable without a
    preference takes its one value (as `$model_a` follows `$pool_a`)."""
    values = {"__rate_interval": rate_interval}
    for v in d.variables:
        if v.constant:
            values[v.name] = v.query
            continue
        selector, label = variable_source(v)
        series = prom.api("series", **{"match[]": substitute(selector, values),
                                       "start": start, "end": end})
        found = sorted({s[label] for s in series if label in s})
        want = preferred.get(v.name)
        if want is None and v.hidden and len(found) == 1:
            want = found[0]
        assert found and (want == ALL or want in found), (d.uid, v.name, want, found)
        values[v.name] = want
    return values


def instant(prom: PrometheusServer, p: Panel, values: dict[str, str], at: float
            ) -> list[list[dict[str, Any]]]:
    """Each of the panel's queries at `at`: Prometheus's result vectors."""
    return [prom.query(substitute(q.expr, values), at) for q in p.queries]
