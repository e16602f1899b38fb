{{/* Where the puller finds S3: "" = AWS's default endpoint. */}}
{{- define "llmserve.s3.endpoint" -}}
{{- if .Values.modelStorage.s3.endpointUrl -}}
{{- .Values.modelStorage.s3.endpointUrl -}}
{{- else if .Values.minio.enabled -}}
{{- printf "http://%s.%s.svc.%s:9000" (include "llmserve.minio.fullname" .) .Release.Namespace .Values.clusterDomain -}}
{{- end -}}
{{- end -}}

{{/* The Secret and keys holding S3 credentials: YAML {name, idKey, secretKey}, or {} for none. */}}
{{- define "llmserve.s3.credentials" -}}
{{- $s3 := .Values.modelStorage.s3 -}}
{{- if $s3.existingSecret -}}
{{- toYaml (dict "name" $s3.existingSecret "idKey" $s3.accessKeyIdKey "secretKey" $s3.secretAccessKeyKey) -}}
{{- else if $s3.accessKeyId -}}
{{- toYaml (dict "name" (printf "%s-s3" (include "llmserve.fullname" .)) "idKey" "AWS_ACCESS_KEY_ID" "secretKey" "AWS_SECRET_ACCESS_KEY") -}}
{{- else if .Values.minio.enabled -}}
{{- toYaml (dict "name" (include "llmserve.minio.secretName" .) "idKey" "rootUser" "secretKey" "rootPassword") -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* The puller's environment: endpoint, region and credentials. Only the model-fetch Job gets it. */}}
{{- define "llmserve.s3.env" -}}
{{- $endpoint := include "llmserve.s3.endpoint" . -}}
{{- $creds := include "llmserve.s3.credentials" . | fromYaml -}}
{{- with $endpoint }}
- name: MODEL_STORE_ENDPOINT_URL
  value: {{ . | quote }}
{{- end }}
- name: AWS_REGION
  value: {{ .Values.modelStorage.s3.region | quote }}
{{- if $creds.name }}
- name: AWS_ACCESS_KEY_ID
  valueFrom:
    secretKeyRef:
      name: {{ $creds.name }}
      key: {{ $creds.idKey }}
- name: AWS_SECRET_ACCESS_KEY
  valueFrom:
    secretKeyRef:
      name: {{ $creds.name }}
      key: {{ $creds.secretKey }}
{{- end }}
{{- end -}}
