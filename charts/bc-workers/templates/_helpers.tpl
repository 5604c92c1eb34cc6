{{/* Names, labels and the pieces every pod shares. */}}

{{- define "bcw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "bcw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bcw.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "bcw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: bc-control-plane
{{- end -}}

{{- define "bcw.selector" -}}
app.kubernetes.io/name: {{ include "bcw.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "bcw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bcw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "bcw.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}

{{- define "bcw.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- printf "%s-database" (include "bcw.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* The environment every container gets. Call with (dict "root" $ "service" "bcw-liveness"). */}}
{{- define "bcw.env" -}}
{{- $v := .root.Values -}}
- name: POD_NAME
  valueFrom: {fieldRef: {fieldPath: metadata.name}}
- name: POD_NAMESPACE
  valueFrom: {fieldRef: {fieldPath: metadata.namespace}}
- name: BCW_INSTANCE
  value: "$(POD_NAME)"
- name: BCW_SUBJECT_ROOT
  value: {{ $v.subjectRoot | quote }}
- name: BCW_LOG_FORMAT
  value: {{ $v.logFormat | quote }}
- name: BCW_LOG_LEVEL
  value: {{ $v.logLevel | quote }}
- name: BCW_HEALTH_PORT
  value: {{ $v.healthPort | quote }}
- name: BCW_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "bcw.databaseSecret" .root }}
      key: {{ if $v.database.existingSecret }}{{ $v.database.existingSecretKey }}{{ else }}url{{ end }}
- name: BCW_DATABASE_POOL_MAX
  value: {{ $v.database.poolMax | quote }}
- name: BCW_DATABASE_STATEMENT_CACHE_SIZE
  value: {{ $v.database.statementCacheSize | quote }}
- name: BCW_NATS_URL
  value: {{ $v.nats.url | quote }}
- name: BCW_NATS_STREAM_REPLICAS
  value: {{ $v.nats.streamReplicas | quote }}
{{- if $v.nats.credentials.existingSecret }}
- name: BCW_NATS_CREDS_FILE
  value: /etc/bcw/nats/{{ $v.nats.credentials.existingSecretKey }}
{{- end }}
{{- if $v.nats.tls.existingSecret }}
- name: BCW_NATS_TLS_CA_FILE
  value: /etc/bcw/tls/ca.crt
{{- if $v.nats.tls.mutual }}
- name: BCW_NATS_TLS_CERT_FILE
  value: /etc/bcw/tls/tls.crt
- name: BCW_NATS_TLS_KEY_FILE
  value: /etc/bcw/tls/tls.key
{{- end }}
{{- end }}
- name: OTEL_SERVICE_NAME
  value: {{ .service | quote }}
- name: OTEL_RESOURCE_ATTRIBUTES
  value: {{ printf "service.namespace=%s,k8s.namespace.name=$(POD_NAMESPACE),k8s.pod.name=$(POD_NAME)%s" .root.Release.Name (ternary (printf ",%s" $v.otel.resourceAttributes) "" (ne $v.otel.resourceAttributes "")) | quote }}
{{- if $v.otel.endpoint }}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ $v.otel.endpoint | quote }}
{{- end }}
{{- with $v.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "bcw.volumeMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.nats.credentials.existingSecret }}
- name: nats-credentials
  mountPath: /etc/bcw/nats
  readOnly: true
{{- end }}
{{- if .Values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/bcw/tls
  readOnly: true
{{- end }}
{{- end -}}

{{- define "bcw.volumes" -}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- if .Values.nats.credentials.existingSecret }}
- name: nats-credentials
  secret: {secretName: {{ .Values.nats.credentials.existingSecret }}, defaultMode: 0400}
{{- end }}
{{- if .Values.nats.tls.existingSecret }}
- name: nats-tls
  secret: {secretName: {{ .Values.nats.tls.existingSecret }}, defaultMode: 0400}
{{- end }}
{{- end -}}
