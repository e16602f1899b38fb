"""What every dashboard shares: the data source, the template variables, the panel shapes.

Label conventions, as the chart's monitors produce them:
- gateway series (ServiceMonitor): `namespace`, `pod`; `model` on request metrics; the flow
  metrics' `pool` is the gateway's admission pool, which is per model (its value is the model);
- engine series (PodMonitor): `namespace`, `pod`, `pool` (the chart's pool name), and vLLM's own
  `model_name`;
- llmserve_pool_info{pool, model, tp, pp, nodes} joins the two.
So `$model` filters the gateway's series and vLLM's `model_name`; `$pool` filters the engines'.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import prometheus, stat, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import prometheus as pm

DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"
# Custom Grafana units (suffix:): tokens have no built-in unit.
TOKENS_PER_S = "suffix: tok/s"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass
class Panel:
    """One panel as data: what the generator, the e2e test and the PNG renderer all read."""

    title: str
    description: str
    unit: str
    queries: list[Query]
    kind: str = "timeseries"  # or "table" (instant queries, labels as columns)
    width: int = 8
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class Row:
    title: str
    panels: list[Panel]


@dataclass
class Variable:
    name: str
    label: str
    # label_values(...) for Grafana, which the e2e test resolves the same way; a constant's value.
    query: str
    description: str
    multi: bool = True
    hidden: bool = False
    constant: bool = False  # hidden, one value; the chart sets it from its values at render time


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    variables: list[Variable]
    rows: list[Row]

    def panels(self) -> list[Panel]:
        return [p for r in self.rows for p in r.panels]


def q(expr: str, legend: str = "") -> Query:
    return Query(" ".join(expr.split()), legend)


def quantiles(metric: str, selector: str, qs: tuple[float, ...], by: str = "",
              legend: str = "") -> list[Query]:
    """histogram_quantile of `metric`'s buckets, one query per quantile."""
    group = f"{by}, le" if by else "le"
    return [
        q(f"histogram_quantile({x}, sum by ({group}) (rate({metric}_bucket{{{selector}}}[{RATE}])))",
          f"{legend}p{round(x * 100)}" + (f" {{{{{by}}}}}" if by else ""))
        for x in qs
    ]


def namespace_variable(metric: str) -> Variable:
    return Variable("namespace", "Namespace", f"label_values({metric}, namespace)",
                    "Kubernetes namespace of the release")


def _variable(v: Variable) -> Any:
    if v.constant:
        return db.ConstantVariable(v.name).label(v.label).description(v.description).value(v.query)
    b = (db.QueryVariable(v.name).label(v.label).description(v.description).datasource(DS)
         .query(v.query).refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
         .sort(dm.VariableSort.ALPHABETICAL_ASC))
    if v.multi:
        # `.*` rather than Grafana's list of every value: a value that appears later still matches.
        b = b.multi(True).include_all(True).all_value(".*")
    if v.hidden:
        b = b.hide(dm.VariableHide.HIDE_VARIABLE)
    return b


def _panel(p: Panel, pid: int, height: int) -> Any:
    if p.kind == "table":
        b: Any = table.Panel()
    elif p.kind == "stat":
        b = stat.Panel()
    else:
        b = (timeseries.Panel().line_width(1).fill_opacity(10)
             .legend(cb.VizLegendOptions().show_legend(True)
                     .display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM))
             .tooltip(cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI)
                      .sort(cm.SortOrder.DESCENDING)))
        if "min" in p.extra:
            b = b.min(p.extra["min"])
        if "thresholds" in p.extra:
            # Dashed lines at each value (the base step, below the first, draws nothing).
            steps = [dm.Threshold(None, "transparent"),
                     *(dm.Threshold(v, c) for v, c in zip(p.extra["thresholds"],
                                                          ("orange", "red", "dark-red"),
                                                          strict=False))]
            b = (b.thresholds(db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(steps))
                 .thresholds_style(cb.GraphThresholdsStyleConfig()
                                   .mode(cm.GraphTresholdsStyleMode.DASHED)))
    b = (b.id(pid).title(p.title).description(p.description).unit(p.unit).datasource(DS)
         .span(p.width).height(height))
    for i, query in enumerate(p.queries):
        t = prometheus.Dataquery().expr(query.expr).ref_id(chr(ord("A") + i)).datasource(DS)
        if query.legend:
            t = t.legend_format(query.legend)
        if p.kind in ("table", "stat"):
            t = t.instant().format(pm.PromQueryFormat.TABLE)
        b = b.with_target(t)
    return b


def build(d: Dashboard) -> dict[str, Any]:
    """The dashboard's Grafana JSON model."""
    b = (db.Dashboard(d.title).uid(d.uid).description(d.description).tags(["llmserve"])
         .time("now-1h", "now").refresh("30s").editable()
         .tooltip(dm.DashboardCursorSync.CROSSHAIR)
         .with_variable(db.DatasourceVariable("datasource").label("Data source")
                        .description("The Prometheus that scrapes the release").type("prometheus")))
    for v in d.variables:
        b = b.with_variable(_variable(v))
    pid = 1
    for row in d.rows:
        b = b.with_row(db.Row(row.title).id(pid))
        pid += 1
        for p in row.panels:
            b = b.with_panel(_panel(p, pid, 8))
            pid += 1
    out: dict[str, Any] = json.loads(json.dumps(b.build(), cls=JSONEncoder))
    return out


def to_json(d: Dashboard) -> str:
    return json.dumps(build(d), indent=2, sort_keys=True) + "\n"


# Names start with a letter: `$1` in a label_replace() is a regex group, which Grafana leaves be.
_VAR = re.compile(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)")


def substitute(text: str, values: dict[str, str]) -> str:
    """Grafana's template substitution for one value per variable (`$x` and `${x}`); names are
    matched whole, so `$pool` never eats the start of `$pool_a`. Unknown names raise."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {text!r}")
        return values[name]

    return _VAR.sub(one, text)


def variable_source(v: Variable) -> tuple[str, str]:
    """label_values(<selector>, <label>) -> (selector, label)."""
    if v.constant:
        raise ValueError(f"${v.name} is a constant ({v.query}), not a label_values() query")
    m = re.fullmatch(r"label_values\((.*), (\w+)\)", v.query)
    if m is None:
        raise ValueError(f"${v.name}: not a label_values() query: {v.query}")
    return m.group(1), m.group(2)
