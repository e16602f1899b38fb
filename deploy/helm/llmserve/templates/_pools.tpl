{{/*
One worker pool, normalised: workerDefaults merged under the pool's own keys, defaults filled in,
layout derived and checked. Returns YAML; callers do `include ... | fromYaml`.
  (dict "root" $ "pool" <entry of .Values.models> "index" <int>)

Derived keys: resourceName, serving/multiNode flags, nodes (pods per group), gpusPerPod,
modelDir, imageRef, lora (its LoRA adapters, normalised: _adapters.tpl), pooling (the pool
serves embeddings, score, rerank and classify, not generation: worker/rules.py is_pooling).

The layout rule (worker/rules.py, which the planner and the worker apply too): tensor parallel
stays inside a node (it needs the intra-node interconnect), pipeline stages are what crosses
nodes. Without multiNode a replica is one pod running every stage (vLLM's mp executor, no Ray);
with it, a LeaderWorkerSet group of `nodes` pods, each running tensorParallelSize x
pipelineParallelSize / nodes engine ranks, one GPU each. values.schema.json, generated from
worker/rules.py, refuses a pipelineParallelSize that is not a multiple of multiNode.nodes.
*/}}
{{- define "llmserve.pool" -}}
{{- $root := .root -}}
{{- $where := printf "models[%d] (%s)" (int .index) (.pool.name | default "?") -}}
{{- $m := include "llmserve.deepMerge" (dict "base" (omit $root.Values.workerDefaults "port" "kvEventsPort") "over" .pool) | fromYaml -}}
{{- if hasKey $m "Error" -}}{{- fail (printf "%s: %s" $where $m.Error) -}}{{- end -}}
{{- $_ := set $m "revision" ($m.revision | default "main") -}}
{{- $_ := set $m "servedModelName" ($m.servedModelName | default $m.model) -}}
{{- $_ := set $m "device" ($m.device | default "gpu") -}}
{{- $_ := set $m "dtype" ($m.dtype | default "auto") -}}
{{- $_ := set $m "runner" ($m.runner | default "auto") -}}
{{- $_ := set $m "convert" ($m.convert | default "auto") -}}
{{- /* worker/rules.py is_pooling (tests/deploy/test_pooling_chart.py checks every pair). */ -}}
{{- $_ := set $m "pooling" (or (eq $m.runner "pooling") (and (eq $m.runner "auto") (has $m.convert (list "embed" "classify")))) -}}
{{- $_ := set $m "responsesStore" (ternary true false (eq (toString $m.responsesStore) "true")) -}}
{{- $_ := set $m "tensorParallelSize" (int ($m.tensorParallelSize | default 1)) -}}
{{- $_ := set $m "pipelineParallelSize" (int ($m.pipelineParallelSize | default 1)) -}}
{{- if and (hasKey .pool "replicas") ($m.autoscaling | default dict).enabled -}}
{{- fail (printf "%s: replicas is set, but autoscaling.enabled: the autoscaler sets the count (give autoscaling.minReplicas/maxReplicas)" $where) -}}
{{- end -}}
{{- /* Keys only KEDA reads, set on a pool that autoscales with an HPA, would be ignored. */ -}}
{{- $own := .pool.autoscaling | default dict -}}
{{- if and ($m.autoscaling | default dict).enabled (eq ($m.autoscaling.engine | default "keda") "hpa") -}}
{{- range $key := list "prometheusAddress" "query" "pollingIntervalSeconds" "cooldownSeconds" "wakeBudgetSeconds" -}}
{{- if and (hasKey $own $key) (not (kindIs "invalid" (get $own $key))) -}}
{{- fail (printf "%s: autoscaling.%s is read by KEDA only, and this pool autoscales with engine=hpa" $where $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $_ := set $m "replicas" (int (ternary 1 $m.replicas (kindIs "invalid" $m.replicas))) -}}
{{- $_ := set $m "port" (int (include "llmserve.workerPort" $root)) -}}
{{- /* Chart-wide, as the port: the gateway looks for every replica's events on this one. */ -}}
{{- $kv := $root.Values.workerDefaults.kvEventsPort -}}
{{- $_ := set $m "kvEventsPort" (ternary nil (int $kv) (kindIs "invalid" $kv)) -}}
{{- if and $m.kvEventsPort (or (eq (int $m.kvEventsPort) (int $m.port)) (eq (add1 (int $m.kvEventsPort)) (int $m.port))) -}}
{{- fail (printf "%s: workerDefaults.kvEventsPort=%d (and the next port, its replay socket) collides with workerDefaults.port" $where (int $m.kvEventsPort)) -}}
{{- end -}}
{{- $_ := set $m "drainTimeoutSeconds" (include "llmserve.drainSeconds" (dict "root" $root "value" $m.drainTimeoutSeconds "where" (printf "%s: drainTimeoutSeconds" $where)) | int) -}}
{{- $tp := $m.tensorParallelSize -}}
{{- $pp := $m.pipelineParallelSize -}}
{{- $nodes := 1 -}}
{{- if $m.multiNode -}}
{{- $mn := merge (deepCopy $m.multiNode) (dict "masterPort" (int (include "llmserve.default.masterPort" $root)) "restartPolicy" "RecreateGroupOnPodRestart" "startupPolicy" "LeaderCreated") -}}
{{- /* Not through merge: it would take an explicit false for unset. */ -}}
{{- $_ := set $mn "distinctNodes" (ternary true $mn.distinctNodes (not (hasKey $mn "distinctNodes"))) -}}
{{- $_ := set $m "multiNode" $mn -}}
{{- $nodes = int $mn.nodes -}}
{{- if eq (int $mn.masterPort) (int $m.port) -}}
{{- fail (printf "%s: multiNode.masterPort=%d collides with workerDefaults.port" $where (int $mn.masterPort)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set $m "nodes" $nodes -}}
{{- $_ := set $m "isMultiNode" (gt $nodes 1) -}}
{{- $gpus := 0 -}}
{{- if eq $m.device "gpu" -}}
{{- $gpus = div (mul $tp $pp) $nodes -}}
{{- end -}}
{{- $_ := set $m "gpusPerPod" $gpus -}}
{{- /* 45 characters: LWS appends "-<group>" (up to 6 digits) to make a StatefulSet name, which must
stay within 52. A longer name keeps its first 36 characters and gets a hash of the whole name, so
two long pool names never collide. */ -}}
{{- $resourceName := printf "%s-%s" (include "llmserve.fullname" $root) $m.name -}}
{{- if gt (len $resourceName) 45 -}}
{{- $resourceName = printf "%s-%s" ($resourceName | trunc 36 | trimSuffix "-") ($resourceName | sha256sum | trunc 8) -}}
{{- end -}}
{{- $_ := set $m "resourceName" $resourceName -}}
{{- $_ := set $m "modelDir" (printf "%s/%s/%s" $root.Values.modelStorage.mountPath $m.model $m.revision) -}}
{{- $_ := set $m "lora" (include "llmserve.lora" (dict "root" $root "m" $m) | fromYaml) -}}
{{- $image := $m.image | default dict -}}
{{- if not $image.repository -}}
{{- $image = ternary $root.Values.image.workerGpu $root.Values.image.workerCpu (eq $m.device "gpu") -}}
{{- end -}}
{{- $_ := set $m "imageRef" (include "llmserve.image" (dict "root" $root "image" $image)) -}}
{{- toYaml $m -}}
{{- end -}}

{{/* Every pool, normalised, as a YAML list under `pools`; also checks names are unique. */}}
{{- define "llmserve.pools" -}}
{{- $pools := list -}}
{{- $seen := dict -}}
{{- $served := dict -}}
{{- range $i, $pool := .Values.models -}}
{{- $m := include "llmserve.pool" (dict "root" $ "pool" $pool "index" $i) | fromYaml -}}
{{- if hasKey $seen $m.name -}}
{{- fail (printf "models[%d]: pool name %q is used twice" $i $m.name) -}}
{{- end -}}
{{- $_ := set $seen $m.name true -}}
{{- /* The gateway routes by model name: a name served by a pooling pool and a generating one
would send embeddings to engines that cannot pool, and chat to engines that cannot generate. */ -}}
{{- $kind := ternary "pooling" "generate" $m.pooling -}}
{{- $other := get $served $m.servedModelName -}}
{{- if and $other (ne $other $kind) -}}
{{- fail (printf "models[%d] (%s): servedModelName %q is served by a %s pool and a %s pool; give the pooling pool a servedModelName of its own" $i $m.name $m.servedModelName $other $kind) -}}
{{- end -}}
{{- $_ := set $served $m.servedModelName $kind -}}
{{- $pools = append $pools $m -}}
{{- end -}}
{{- /* A request names a model or an adapter: one name may not mean both (the gateway refuses
GATEWAY_POOLS so too). */ -}}
{{- $models := dict -}}
{{- range $pools }}{{ $_ := set $models .servedModelName .name }}{{ end -}}
{{- range $pools -}}
{{- $pool := .name -}}
{{- range .lora.adapters -}}
{{- if hasKey $models .name -}}
{{- fail (printf "models[%s].lora.adapters: %q is the model name of pool %s" $pool .name (get $models .name)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "pools" $pools) -}}
{{- end -}}

{{/*
The model downloads: one per (model, revision), whatever number of pools use it. Pools that share
a model and revision must agree on the source. Returns YAML {fetches: [{model, revision, source,
dir, imageRef}]}; preloaded models need no download and are left out.
*/}}
{{- define "llmserve.fetches" -}}
{{- $byKey := dict -}}
{{- $order := list -}}
{{- range (include "llmserve.pools" . | fromYaml).pools -}}
{{- $key := printf "%s/%s" .model .revision -}}
{{- if hasKey $byKey $key -}}
{{- if ne (toJson (get $byKey $key).source) (toJson .source) -}}
{{- fail (printf "pool %q: model %s is also used by another pool with a different source" .name $key) -}}
{{- end -}}
{{- else -}}
{{- $_ := set $byKey $key (dict "model" .model "revision" .revision "source" .source "dir" .modelDir "imageRef" .imageRef) -}}
{{- $order = append $order $key -}}
{{- end -}}
{{- end -}}
{{- $fetches := list -}}
{{- range $order -}}
{{- $f := get $byKey . -}}
{{- if not $f.source.preloaded -}}
{{- $fetches = append $fetches $f -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "fetches" $fetches) -}}
{{- end -}}
