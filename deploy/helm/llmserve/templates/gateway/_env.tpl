{{/*
GATEWAY_* settings the chart manages; gateway.env may not set these (a second value for the same
setting would silently win or lose depending on order).
*/}}
{{- define "llmserve.gateway.managedEnv" -}}
GATEWAY_MODE GATEWAY_EPP__PORT GATEWAY_EPP__METRICS_PORT GATEWAY_EPP__POOL_NAME GATEWAY_EPP__POOL_NAMESPACE GATEWAY_HOST GATEWAY_PORT GATEWAY_EDGE__PROBE_PORT GATEWAY_DISCOVERY GATEWAY_BACKENDS GATEWAY_DNS_NAME GATEWAY_DNS_PORT GATEWAY_K8S_NAMESPACE GATEWAY_K8S_SERVICE GATEWAY_K8S_PORT GATEWAY_DRAIN_TIMEOUT_S GATEWAY_TIMEOUTS__TOTAL_S GATEWAY_TIMEOUTS GATEWAY_API_KEYS_FILE GATEWAY_FLOW__LIMITS_REDIS_URL GATEWAY_FLOW__LIMITS_REDIS_FAIL GATEWAY_FLOW__LIMIT_REPLICAS GATEWAY_POOLS GATEWAY_ADMIN_KEY GATEWAY_ADMIN_KEY_SHA256 GATEWAY_LORA__MAX_LORAS GATEWAY_KV__EVENTS_PORT
{{- end -}}

{{/*
How many gateway replicas share each key's limits without Redis: each enforces 1/N. Under the
HorizontalPodAutoscaler the count moves; the chart divides by minReplicas (a tenant gets up to
maxReplicas/minReplicas x its limit when scaled out; NOTES says so).
*/}}
{{- define "llmserve.gateway.limitReplicas" -}}
{{- $g := .Values.gateway -}}
{{- ternary $g.autoscaling.minReplicas $g.replicas $g.autoscaling.enabled | int -}}
{{- end -}}

{{/*
The gateway's Deployments, as YAML {instances: [{name, pool, poolResource}]}. mode=gateway: one,
the gateway. mode=epp: one endpoint picker per worker pool, as the Gateway API Inference Extension
deploys them (an EPP serves the InferencePool it is started for, `<pool>-epp`): it finds that
pool's pods from the InferencePool (GATEWAY_DISCOVERY=inferencepool) and picks among them only,
so a request the HTTPRoute sent to one pool never lands on another pool's pod, even when two
pools serve the same model.
*/}}
{{- define "llmserve.gateway.instances" -}}
{{- $out := list -}}
{{- if eq .Values.gateway.mode "epp" -}}
{{- range (include "llmserve.pools" . | fromYaml).pools -}}
{{- $out = append $out (dict "name" (printf "%s-epp" .resourceName) "pool" .name "poolResource" .resourceName) -}}
{{- end -}}
{{- else -}}
{{- $out = append $out (dict "name" (include "llmserve.gateway.fullname" .) "pool" "" "poolResource" "") -}}
{{- end -}}
{{- toYaml (dict "instances" $out) -}}
{{- end -}}

{{/* One instance's pod selector: the gateway's, and in EPP mode its pool. (dict "root" $ "instance" .) */}}
{{- define "llmserve.gateway.selector" -}}
{{ include "llmserve.componentSelector" (dict "root" .root "component" "gateway") }}
{{- with .instance.pool }}
llmserve.io/epp-pool: {{ . }}
{{- end }}
{{- end -}}

{{/* The env of one instance (dict "root" $ "instance" <llmserve.gateway.instances entry>). */}}
{{- define "llmserve.gateway.env" -}}
{{- $instance := .instance -}}
{{- with .root -}}
{{- $root := . -}}
{{- $g := .Values.gateway -}}
- name: GATEWAY_HOST
  value: "0.0.0.0"
- name: GATEWAY_PORT
  value: {{ $g.port | int | toString | quote }}
{{- if eq ($g.probePort | int) ($g.port | int) }}
{{- fail "gateway.probePort must differ from gateway.port (the probes get a listener of their own)" }}
{{- end }}
- name: GATEWAY_EDGE__PROBE_PORT
  value: {{ $g.probePort | int | toString | quote }}
- name: GATEWAY_MODE
  value: {{ $g.mode | quote }}
{{- if eq $g.mode "epp" }}
{{- if has ($g.eppPort | int) (list ($g.port | int) ($g.probePort | int)) }}
{{- fail "gateway.eppPort must differ from gateway.port and gateway.probePort" }}
{{- end }}
- name: GATEWAY_EPP__PORT
  value: {{ $g.eppPort | int | toString | quote }}
{{- /* The EPP serves /metrics on the probe port, where the ServiceMonitor scrapes. */}}
- name: GATEWAY_EPP__METRICS_PORT
  value: {{ $g.probePort | int | toString | quote }}
{{- end }}
{{- if $instance.pool }}
{{- /* The EPP of one pool: its pods, from the InferencePool's selector and target ports. */}}
- name: GATEWAY_DISCOVERY
  value: "inferencepool"
- name: GATEWAY_EPP__POOL_NAME
  value: {{ $instance.poolResource | quote }}
- name: GATEWAY_EPP__POOL_NAMESPACE
  value: {{ .Release.Namespace | quote }}
{{- else }}
- name: GATEWAY_DISCOVERY
  value: {{ $g.discovery | quote }}
{{- end }}
{{- if $instance.pool }}
{{- else if eq $g.discovery "kubernetes" }}
- name: GATEWAY_K8S_NAMESPACE
  value: {{ .Release.Namespace | quote }}
- name: GATEWAY_K8S_SERVICE
  value: {{ include "llmserve.workers.serviceName" . | quote }}
- name: GATEWAY_K8S_PORT
  value: {{ include "llmserve.workerPort" . | quote }}
{{- else if eq $g.discovery "dns" }}
- name: GATEWAY_DNS_NAME
  value: {{ printf "%s.%s.svc.%s" (include "llmserve.workers.serviceName" .) .Release.Namespace .Values.clusterDomain | quote }}
- name: GATEWAY_DNS_PORT
  value: {{ include "llmserve.workerPort" . | quote }}
{{- else }}
- name: GATEWAY_BACKENDS
  value: {{ toJson $g.backends | quote }}
{{- end }}
{{- /* Each pool's layout: llmserve_pool_info for the dashboards, and /v1/models for benchmark
reports (python -m loadtest compare), which the gateway cannot learn from vLLM's API. */}}
{{- /* A pool its autoscaler may park at zero is declared so: the gateway keeps its model listed
and holds its requests up to the wake budget while a replica starts (docs/autoscaling.md). */}}
{{- $layouts := list }}
{{- range (include "llmserve.pools" . | fromYaml).pools }}
{{- if or (not $instance.pool) (eq $instance.pool .name) }}
{{- $layout := dict "name" .name "model" .servedModelName "tp" (int .tensorParallelSize) "pp" (int .pipelineParallelSize) "nodes" (int .nodes) }}
{{- $a := include "llmserve.autoscaling" (dict "root" $root "m" .) | fromYaml }}
{{- if $a.scaleToZero }}
{{- $_ := set $layout "scale_to_zero" true }}
{{- $_ := set $layout "wake_budget_s" (int $a.wakeBudgetSeconds) }}
{{- end }}
{{- /* Adapters its workers load at start: a gateway that has seen no replica yet (the pool
parked at zero) knows them, and their requests wait for the pool rather than meet a 404. */}}
{{- if .lora.adapters }}
{{- $names := list }}
{{- range .lora.adapters }}{{ $names = append $names .name }}{{ end }}
{{- $_ := set $layout "adapters" $names }}
{{- end }}
{{- $layouts = append $layouts $layout }}
{{- end }}
{{- end }}
- name: GATEWAY_POOLS
  value: {{ toJson $layouts | quote }}
{{- /* The longest stream: the gateway ends a request at this, and the drains (and the grace
periods after them) wait this long by default, so a drain never cuts a stream the gateway lets
run. */}}
- name: GATEWAY_TIMEOUTS__TOTAL_S
  value: {{ .Values.maxStreamSeconds | int | toString | quote }}
{{- with .Values.workerDefaults.kvEventsPort }}
{{- /* Where kv_aware routing (GATEWAY_ROUTING_POLICY=kv_aware in gateway.env, with
GATEWAY_KV__TOKENIZERS) finds every replica's KV cache events. */}}
- name: GATEWAY_KV__EVENTS_PORT
  value: {{ . | int | toString | quote }}
{{- end }}
- name: GATEWAY_DRAIN_TIMEOUT_S
  value: {{ include "llmserve.drainSeconds" (dict "root" . "value" $g.drainTimeoutSeconds "where" "gateway.drainTimeoutSeconds") | quote }}
{{- if $g.apiKeys.enabled }}
- name: GATEWAY_API_KEYS_FILE
  value: {{ printf "/etc/llmserve/api-keys/%s" $g.apiKeys.secretKey | quote }}
{{- $shared := $g.apiKeys.sharedLimits }}
{{- if $shared.redisUrl }}
- name: GATEWAY_FLOW__LIMITS_REDIS_URL
  value: {{ $shared.redisUrl | quote }}
{{- else if $shared.existingSecret }}
- name: GATEWAY_FLOW__LIMITS_REDIS_URL
  valueFrom:
    secretKeyRef:
      name: {{ $shared.existingSecret }}
      key: {{ $shared.secretKey }}
{{- else }}
- name: GATEWAY_FLOW__LIMIT_REPLICAS
  value: {{ include "llmserve.gateway.limitReplicas" . | quote }}
{{- end }}
{{- if or $shared.redisUrl $shared.existingSecret }}
- name: GATEWAY_FLOW__LIMITS_REDIS_FAIL
  value: {{ $shared.fail | quote }}
{{- end }}
{{- end }}
{{- /* LoRA adapters (_adapters.tpl): each served model's --max-loras, for residency routing;
the admin API's key (adding adapters at run time) from a Secret, or only its digest. */}}
{{- $maxLoras := include "llmserve.lora.gatewayMaxLoras" . }}
{{- if ne $maxLoras "{}" }}
- name: GATEWAY_LORA__MAX_LORAS
  value: {{ $maxLoras | quote }}
{{- end }}
{{- $admin := $g.adminKey }}
{{- if and $admin.existingSecret $admin.sha256 }}
{{- fail "gateway.adminKey: set existingSecret or sha256, not both" }}
{{- else if $admin.existingSecret }}
- name: GATEWAY_ADMIN_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $admin.existingSecret }}
      key: {{ $admin.secretKey }}
{{- else if $admin.sha256 }}
- name: GATEWAY_ADMIN_KEY_SHA256
  value: {{ $admin.sha256 | lower | quote }}
{{- end }}
{{- $managed := splitList " " (include "llmserve.gateway.managedEnv" .) }}
{{- $known := splitList " " (include "llmserve.gateway.settings" .) }}
{{- range $name, $value := $g.env }}
{{- if has $name $managed }}
{{- fail (printf "gateway.env.%s is managed by the chart; set it through the gateway.* values" $name) }}
{{- end }}
{{- if not (has $name $known) }}
{{- fail (printf "gateway.env.%s is not a gateway setting (the gateway would ignore it; docs/settings.md lists them)" $name) }}
{{- end }}
- name: {{ $name }}
  value: {{ $value | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}
