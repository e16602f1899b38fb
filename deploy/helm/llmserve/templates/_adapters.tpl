{{/*
LoRA adapters (docs/lora.md). A pool's `lora` values, normalised:
  (dict "root" $ "m" <pool, normalised so far>) -> YAML
  {enabled, adapters: [{name, s3, revision, dir}], maxLoras, maxLoraRank, runtimeUpdates}

Each adapter is fetched once into ROOT/adapters/<name>/<revision>/ by a fetch Job of its own
(`model_store pull --base-model <model>`, which refuses an adapter of another base), the workers'
init container waits for its completion marker as for the model's, and the worker loads it at
start (WORKER_LORA_ADAPTERS -> --lora-modules). maxLoras defaults to one slot per listed adapter,
as the worker's own default; the gateway gets the same number per served model
(GATEWAY_LORA__MAX_LORAS), so its residency routing knows how many adapters a replica holds.
*/}}
{{- define "llmserve.lora" -}}
{{- $root := .root -}}
{{- $m := .m -}}
{{- $l := $m.lora | default dict -}}
{{- $adapters := list -}}
{{- $seen := dict -}}
{{- range ($l.adapters | default list) -}}
{{- if hasKey $seen .name -}}
{{- fail (printf "models[%s].lora.adapters: %q is listed twice" $m.name .name) -}}
{{- end -}}
{{- if eq .name $m.servedModelName -}}
{{- fail (printf "models[%s].lora.adapters: %q is the pool's own model name" $m.name .name) -}}
{{- end -}}
{{- $_ := set $seen .name true -}}
{{- $revision := .revision | default (last (splitList "/" (trimSuffix "/" .s3))) -}}
{{- $dir := printf "%s/adapters/%s/%s" $root.Values.modelStorage.mountPath .name $revision -}}
{{- $adapters = append $adapters (dict "name" .name "s3" .s3 "revision" $revision "dir" $dir) -}}
{{- end -}}
{{- $admin := $root.Values.gateway.adminKey -}}
{{- if and $l.enabled (not $adapters) (not (or $admin.existingSecret $admin.sha256)) -}}
{{- fail (printf "models[%s].lora.enabled lists no adapter and gateway.adminKey is unset: adapters are added at run time through the admin API, which is off without a key" $m.name) -}}
{{- end -}}
{{- /* Values LoRA-off would ignore: refused rather than dropped. */ -}}
{{- if and (hasKey $l "enabled") (not $l.enabled) $adapters -}}
{{- fail (printf "models[%s].lora.enabled is false but lora.adapters lists %d: adapters turn LoRA on; remove them or the false" $m.name (len $adapters)) -}}
{{- end -}}
{{- if not (or $l.enabled $adapters) -}}
{{- range $key := list "maxLoras" "maxLoraRank" "runtimeUpdates" -}}
{{- if and (hasKey $l $key) (not (kindIs "invalid" (get $l $key))) -}}
{{- fail (printf "models[%s].lora.%s is set but LoRA is off (no lora.enabled, no lora.adapters)" $m.name $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $maxLoras := $l.maxLoras | default (max 1 (len $adapters)) -}}
{{- $runtime := ternary true $l.runtimeUpdates (not (hasKey $l "runtimeUpdates")) -}}
{{- toYaml (dict "enabled" (or $l.enabled (gt (len $adapters) 0)) "adapters" $adapters "maxLoras" (int $maxLoras) "maxLoraRank" $l.maxLoraRank "runtimeUpdates" $runtime) -}}
{{- end -}}

{{/* WORKER_* settings of a pool's LoRA adapters (none when LoRA is off). */}}
{{- define "llmserve.lora.workerEnv" -}}
{{- $lora := .lora -}}
{{- if $lora.enabled }}
- name: WORKER_LORA
  value: "true"
{{- if $lora.adapters }}
{{- $byName := dict }}
{{- range $lora.adapters }}
{{- $_ := set $byName .name .dir }}
{{- end }}
- name: WORKER_LORA_ADAPTERS
  value: {{ toJson $byName | quote }}
{{- end }}
- name: WORKER_MAX_LORAS
  value: {{ $lora.maxLoras | int | toString | quote }}
{{- if not (kindIs "invalid" $lora.maxLoraRank) }}
- name: WORKER_MAX_LORA_RANK
  value: {{ $lora.maxLoraRank | int | toString | quote }}
{{- end }}
- name: WORKER_LORA_RUNTIME_UPDATES
  value: {{ $lora.runtimeUpdates | toString | quote }}
{{- end }}
{{- end -}}

{{/*
The adapter downloads: one per (adapter, revision), whatever number of pools list it. Pools that
list the same adapter must agree on its source and serve the same model (its base). Returns YAML
{adapterFetches: [{name, revision, s3, dir, base}]}.
*/}}
{{- define "llmserve.adapterFetches" -}}
{{- $byKey := dict -}}
{{- $order := list -}}
{{- range (include "llmserve.pools" . | fromYaml).pools -}}
{{- $base := .model -}}
{{- $pool := .name -}}
{{- range .lora.adapters -}}
{{- $key := printf "%s/%s" .name .revision -}}
{{- if hasKey $byKey $key -}}
{{- $other := get $byKey $key -}}
{{- if or (ne $other.s3 .s3) (ne $other.base $base) -}}
{{- fail (printf "pool %q: adapter %s is also listed by another pool with another source or base model" $pool $key) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $byKey $key (dict "name" .name "revision" .revision "s3" .s3 "dir" .dir "base" $base) -}}
{{- $order = append $order $key -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $fetches := list -}}
{{- range $order -}}
{{- $fetches = append $fetches (get $byKey .) -}}
{{- end -}}
{{- toYaml (dict "adapterFetches" $fetches) -}}
{{- end -}}

{{/*
GATEWAY_LORA__MAX_LORAS: each served model's --max-loras, from the pools that serve it (the
smallest, when several pools serve one model with different values), for residency routing.
*/}}
{{- define "llmserve.lora.gatewayMaxLoras" -}}
{{- $byModel := dict -}}
{{- range (include "llmserve.pools" . | fromYaml).pools -}}
{{- if .lora.enabled -}}
{{- $n := int .lora.maxLoras -}}
{{- if hasKey $byModel .servedModelName -}}
{{- $n = min $n (get $byModel .servedModelName | int) -}}
{{- end -}}
{{- $_ := set $byModel .servedModelName $n -}}
{{- end -}}
{{- end -}}
{{- toJson $byModel -}}
{{- end -}}
