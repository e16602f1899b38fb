{{/*
Names, labels, images and merging. fullname <= 32 characters, pool names <= 24. A pool's resource
name is cut further (see llmserve.pool): LeaderWorkerSet names its leader StatefulSet <lws>,
its worker StatefulSets <lws>-<group>, and pods <lws>-<group>-<index>; a StatefulSet name over 52
characters cannot create pods (its controller-revision-hash label value is name + "-" + 10).
*/}}

{{- define "llmserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llmserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 32 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 32 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 32 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "llmserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "llmserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "llmserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "llmserve.labels" -}}
helm.sh/chart: {{ include "llmserve.chart" . }}
{{ include "llmserve.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: llmserve
{{- end -}}

{{/* Component names and selectors: (dict "root" $ "component" "gateway") */}}
{{- define "llmserve.componentSelector" -}}
{{ include "llmserve.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "llmserve.componentLabels" -}}
{{ include "llmserve.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/*
Pod-template labels: no chart version and no app version. A pod template that changes on every
chart bump rolls every GPU pod (and a Job's template is immutable, so `helm upgrade` would fail);
the version labels stay on the owning objects.
*/}}
{{- define "llmserve.podTemplateLabels" -}}
{{ include "llmserve.componentSelector" . }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/part-of: llmserve
{{- end -}}

{{- define "llmserve.gateway.fullname" -}}
{{- printf "%s-gateway" (include "llmserve.fullname" .) -}}
{{- end -}}

{{- define "llmserve.gateway.serviceAccountName" -}}
{{- if .Values.gateway.serviceAccount.create -}}
{{- default (include "llmserve.gateway.fullname" .) .Values.gateway.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.gateway.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The headless Service in front of every serving worker pod, whatever its pool. */}}
{{- define "llmserve.workers.serviceName" -}}
{{- printf "%s-workers" (include "llmserve.fullname" .) -}}
{{- end -}}

{{- define "llmserve.worker.serviceAccountName" -}}
{{- printf "%s-worker" (include "llmserve.fullname" .) -}}
{{- end -}}

{{- define "llmserve.modelFetch.serviceAccountName" -}}
{{- printf "%s-model-fetch" (include "llmserve.fullname" .) -}}
{{- end -}}

{{- define "llmserve.modelStorage.claimName" -}}
{{- default (printf "%s-models" (include "llmserve.fullname" .)) .Values.modelStorage.existingClaim -}}
{{- end -}}

{{- define "llmserve.minio.fullname" -}}
{{- printf "%s-minio" (include "llmserve.fullname" .) -}}
{{- end -}}

{{- define "llmserve.minio.secretName" -}}
{{- default (include "llmserve.minio.fullname" .) .Values.minio.existingSecret -}}
{{- end -}}

{{- define "llmserve.apiKeys.secretName" -}}
{{- default (printf "%s-api-keys" (include "llmserve.fullname" .)) .Values.gateway.apiKeys.existingSecret -}}
{{- end -}}

{{/*
Image reference: (dict "root" $ "image" <{repository, tag, digest}>). A digest pins the image and
wins over the tag; the tag defaults to the chart's appVersion.
A repository that names its registry (a first component with "." or ":", or "localhost", as
Docker reads it) is used as it is. Any other is put under image.registry, which is then required:
no llmserve image is published, and a bare name would resolve to Docker Hub, where anyone may
register it.
*/}}
{{- define "llmserve.image" -}}
{{- $repo := .image.repository -}}
{{- $parts := splitList "/" $repo -}}
{{- $host := first $parts -}}
{{- if not (and (gt (len $parts) 1) (or (contains "." $host) (contains ":" $host) (eq $host "localhost"))) -}}
{{- $registry := required "image.registry is required: the registry you pushed the llmserve images to, e.g. --set image.registry=registry.example.com/ml (no public llmserve images exist; deploy/README.md, Images)" .root.Values.image.registry -}}
{{- $repo = printf "%s/%s" (trimSuffix "/" $registry) $repo -}}
{{- end -}}
{{- if .image.digest -}}
{{- printf "%s@%s" $repo .image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .root.Chart.AppVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Recursive merge returning YAML: (dict "base" <map> "over" <map>). Unlike sprig's mergeOverwrite,
an explicit false, 0 or "" in `over` wins: a pool can turn off what the defaults turn on.
*/}}
{{- define "llmserve.deepMerge" -}}
{{- $out := deepCopy .base -}}
{{- range $key, $value := .over -}}
{{- $current := get $out $key -}}
{{- if and (kindIs "map" $value) (kindIs "map" $current) -}}
{{- $_ := set $out $key (include "llmserve.deepMerge" (dict "base" $current "over" $value) | fromYaml) -}}
{{- else -}}
{{- $_ := set $out $key $value -}}
{{- end -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* preStop sleep + drain + margin, or the explicit value (refused when shorter than the first two). */}}
{{- define "llmserve.gracePeriod" -}}
{{- $needed := add (int .preStop) (int .drain) -}}
{{- if kindIs "invalid" .explicit -}}
{{- add $needed (int .margin) -}}
{{- else if lt (int .explicit) $needed -}}
{{- fail (printf "%s.terminationGracePeriodSeconds=%d is shorter than preStopSleepSeconds + drainTimeoutSeconds = %d" .where (int .explicit) $needed) -}}
{{- else -}}
{{- int .explicit -}}
{{- end -}}
{{- end -}}

{{/* The engines' API port: workerDefaults.port, or the worker's default (_rules.tpl). */}}
{{- define "llmserve.workerPort" -}}
{{- if kindIs "invalid" .Values.workerDefaults.port -}}{{- include "llmserve.default.workerPort" . -}}{{- else -}}{{- int .Values.workerDefaults.port -}}{{- end -}}
{{- end -}}

{{/* A drain timeout: the explicit value, or the release's maxStreamSeconds; an explicit value
below maxStreamSeconds is refused, since a drain that short cuts streams the gateway lets run.
The gateway refuses the same pair (GATEWAY_DRAIN_TIMEOUT_S under GATEWAY_TIMEOUTS__TOTAL_S).
(dict "root" $ "value" x "where" "gateway.drainTimeoutSeconds") */}}
{{- define "llmserve.drainSeconds" -}}
{{- $longest := int .root.Values.maxStreamSeconds -}}
{{- if kindIs "invalid" .value -}}{{- $longest -}}
{{- else if lt (int .value) $longest -}}
{{- fail (printf "%s=%d is shorter than maxStreamSeconds=%d: a drain would cut streams the gateway lets run (raise it, or lower maxStreamSeconds)" .where (int .value) $longest) -}}
{{- else -}}{{- int .value -}}{{- end -}}
{{- end -}}

{{- define "llmserve.preStopSleep" -}}
lifecycle:
  preStop:
    exec:
      command: ["sleep", {{ . | int | toString | quote }}]
{{- end -}}
