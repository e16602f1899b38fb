{{/*
Worker autoscaling on the gateway's scaling signal (docs/autoscaling.md).

The signal is llmserve_pool_demand{pool=<served model>}: the requests waiting in the gateway and in
flight, per gateway replica, so every query sums it over the release's gateways. The selector below
is the series the chart's ServiceMonitor produces (job=<gateway Service>); the PrometheusRule uses
the same one.
*/}}
{{- define "llmserve.gateway.seriesSelector" -}}
{{- printf "namespace=%q, job=%q" .Release.Namespace (include "llmserve.gateway.fullname" .) -}}
{{- end -}}

{{/*
One pool's autoscaling, normalised and checked. (dict "root" $ "m" <normalised pool>) -> YAML of
.autoscaling plus:
  startupSeconds   what the start-up probe allows a cold start (periodSeconds x failureThreshold)
  cooldownSeconds  null -> startupSeconds
  query            the PromQL KEDA runs (unless set)
  scaleToZero      enabled with minReplicas 0: the gateway lets requests wait for a replica
  wakeBudgetSeconds  scaleToZero only; null -> startupSeconds (at most the gateway's limit), so
                   a request waits as long as a cold start may take
*/}}
{{- define "llmserve.autoscaling" -}}
{{- $root := .root -}}
{{- $m := .m -}}
{{- $a := deepCopy $m.autoscaling -}}
{{- $where := printf "models[%s].autoscaling" $m.name -}}
{{- $min := int $a.minReplicas -}}
{{- $max := int $a.maxReplicas -}}
{{- $startup := mul (int $m.startupProbe.periodSeconds) (int $m.startupProbe.failureThreshold) -}}
{{- $_ := set $a "startupSeconds" $startup -}}
{{- $_ := set $a "scaleToZero" (and $a.enabled (eq $min 0)) -}}
{{- if and (not $a.enabled) (not (kindIs "invalid" $a.wakeBudgetSeconds)) -}}
{{- fail (printf "%s.wakeBudgetSeconds is set but autoscaling.enabled is false: only a pool at zero makes requests wait for a replica" $where) -}}
{{- end -}}
{{- if $a.enabled -}}
{{- if lt $max $min -}}
{{- fail (printf "%s: maxReplicas=%d is below minReplicas=%d" $where $max $min) -}}
{{- end -}}
{{- if and (eq $a.engine "hpa") (eq $min 0) -}}
{{- fail (printf "%s: minReplicas=0 needs engine=keda (a HorizontalPodAutoscaler never scales to zero)" $where) -}}
{{- end -}}
{{- if $a.scaleToZero -}}
{{- if kindIs "invalid" $a.wakeBudgetSeconds -}}
{{- $_ := set $a "wakeBudgetSeconds" (min $startup (int (include "llmserve.wakeBudgetMax" $root))) -}}
{{- end -}}
{{- else if not (kindIs "invalid" $a.wakeBudgetSeconds) -}}
{{- fail (printf "%s.wakeBudgetSeconds is set but minReplicas=%d: only a pool at zero makes requests wait for a replica" $where $min) -}}
{{- end -}}
{{- /* KEDA's cooldown is the wait before scaling to zero: it matters only at minReplicas 0. */ -}}
{{- if kindIs "invalid" $a.cooldownSeconds -}}
{{- $_ := set $a "cooldownSeconds" $startup -}}
{{- else if and (eq $a.engine "keda") (eq $min 0) (lt (int $a.cooldownSeconds) $startup) -}}
{{- fail (printf "%s.cooldownSeconds=%d is shorter than a cold start may take (startupProbe.periodSeconds x failureThreshold = %d x %d = %ds): a pool that scales down faster than it can start flaps" $where (int $a.cooldownSeconds) (int $m.startupProbe.periodSeconds) (int $m.startupProbe.failureThreshold) $startup) -}}
{{- end -}}
{{- if and (eq $a.engine "keda") (not $a.query) -}}
{{- if not $root.Values.metrics.serviceMonitor.enabled -}}
{{- fail (printf "%s reads the gateway's llmserve_pool_demand from Prometheus: enable metrics.serviceMonitor, or give %s.query" $where $where) -}}
{{- end -}}
{{- $_ := set $a "query" (printf "sum(llmserve_pool_demand{%s, pool=%q})" (include "llmserve.gateway.seriesSelector" $root) $m.servedModelName) -}}
{{- end -}}
{{- if and (eq $a.engine "keda") (not $a.prometheusAddress) -}}
{{- fail (printf "%s.prometheusAddress is required with engine=keda (the Prometheus that scrapes the gateway, e.g. http://prometheus-operated.monitoring.svc:9090)" $where) -}}
{{- end -}}
{{- if and (eq $a.engine "hpa") (not (regexMatch "^([A-Za-z0-9][-A-Za-z0-9_.]{0,61}[A-Za-z0-9]|[A-Za-z0-9])$" $m.servedModelName)) -}}
{{- fail (printf "%s: engine=hpa selects the external metric by pool=%q, which is not a Kubernetes label value; use engine=keda or a servedModelName without '/'" $where $m.servedModelName) -}}
{{- end -}}
{{- end -}}
{{- toYaml $a -}}
{{- end -}}
