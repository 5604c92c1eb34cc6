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
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* An object's `annotations:` block: commonAnnotations, then the object's own ("own", a
   dict that wins); nothing when both are empty. Call with (dict "root" $ "own" <dict or nil>). */}}
{{- define "bcw.annotations" -}}
{{- $all := merge (deepCopy (default dict .own)) (deepCopy (default dict .root.Values.commonAnnotations)) -}}
{{- with $all }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A pod's own labels or annotations: the chart-wide ones (podLabels, podAnnotations),
   then the component's ("own", which wins). Call with (dict "global" <dict or nil> "own"
   <dict or nil>); nothing when both are empty. */}}
{{- define "bcw.podExtra" -}}
{{- with merge (deepCopy (default dict .own)) (deepCopy (default dict .global)) }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/* A container's probe of `kind` (liveness, readiness, startup): the chart's, on the
   workers' health endpoints (docs/runtime.md: /healthz answers as soon as the process
   listens, /readyz once it works), then `defaults.probes.<kind>`, then the component's
   own `probes.<kind>`, merged field by field; a handler given (httpGet, tcpSocket, exec,
   grpc) replaces the chart's; `enabled: false` leaves the probe out. The startup probe
   gives a slow start (imports on a busy node) 5 minutes before the liveness probe may
   restart it. Call with (dict "root" $ "kind" "liveness" "own" <the component's probes or nil>). */}}
{{- define "bcw.probe" -}}
{{- $health := dict "path" "/healthz" "port" "http" -}}
{{- $chart := dict
  "liveness" (dict "httpGet" $health "periodSeconds" 10 "failureThreshold" 3)
  "readiness" (dict "httpGet" (dict "path" "/readyz" "port" "http") "periodSeconds" 5 "failureThreshold" 3)
  "startup" (dict "httpGet" $health "periodSeconds" 5 "failureThreshold" 60) -}}
{{- $probe := deepCopy (index $chart .kind) -}}
{{- $handlers := list "httpGet" "tcpSocket" "exec" "grpc" -}}
{{- $defaults := default dict .root.Values.defaults -}}
{{- range $layer := list (index (default dict $defaults.probes) .kind) (index (default dict .own) .kind) -}}
{{- if $layer -}}
{{- if gt (len (pick $layer "httpGet" "tcpSocket" "exec" "grpc")) 0 }}{{ $probe = omit $probe "httpGet" "tcpSocket" "exec" "grpc" }}{{ end -}}
{{- $probe = mergeOverwrite $probe (deepCopy $layer) -}}
{{- end -}}
{{- end -}}
{{- if or (not (hasKey $probe "enabled")) $probe.enabled -}}
{{- toYaml (omit $probe "enabled") -}}
{{- end -}}
{{- end -}}

{{/* The probes of a worker's or the relay's container. Call with (dict "root" $ "own" <its probes or nil>). */}}
{{- define "bcw.probes" -}}
{{- range $kind := list "startup" "readiness" "liveness" }}
{{- with include "bcw.probe" (dict "root" $.root "kind" $kind "own" $.own) }}
{{ $kind }}Probe:
  {{- . | nindent 2 }}
{{- end }}
{{- end }}
{{- end -}}

{{/* A Deployment's revisionHistoryLimit: its own, else defaults.revisionHistoryLimit, else 5. */}}
{{- define "bcw.revisionHistoryLimit" -}}
{{- $defaults := default dict .root.Values.defaults -}}
{{- $limit := ternary $defaults.revisionHistoryLimit 5 (hasKey $defaults "revisionHistoryLimit") -}}
{{- ternary .spec.revisionHistoryLimit $limit (hasKey .spec "revisionHistoryLimit") -}}
{{- end -}}

{{/* A PodDisruptionBudget's spec, but its selector: minAvailable or maxUnavailable (the
   schema refuses both; neither: maxUnavailable 1), and unhealthyPodEvictionPolicy when set. */}}
{{- define "bcw.pdbSpec" -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- if not (kindIs "invalid" $pdb.minAvailable) }}
minAvailable: {{ $pdb.minAvailable }}
{{- else }}
maxUnavailable: {{ ternary 1 $pdb.maxUnavailable (kindIs "invalid" $pdb.maxUnavailable) }}
{{- end }}
{{- with $pdb.unhealthyPodEvictionPolicy }}
unhealthyPodEvictionPolicy: {{ . }}
{{- end }}
{{- end -}}

{{- define "bcw.selector" -}}
app.kubernetes.io/name: {{ include "bcw.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A worker's replicas: its own `replicas`, else `defaults.replicas` (0 is kept). Call
   with (dict "root" $ "spec" <the worker's values>). */}}
{{- define "bcw.replicas" -}}
{{- ternary .spec.replicas .root.Values.defaults.replicas (hasKey .spec "replicas") -}}
{{- end -}}

{{/* The streams' names start with the subject root, upper case (`bc` → BC_…), as
   `schemas.subjects` names them. */}}
{{- define "bcw.streamPrefix" -}}
{{- .Values.subjectRoot | upper | replace "-" "_" -}}
{{- end -}}

{{/* Objects of a CRD render only where the cluster serves its API (`helm template`:
   `--api-versions monitoring.coreos.com/v1`, `--api-versions keda.sh/v1alpha1`):
   "true" or nothing. */}}
{{- define "bcw.monitoringApi" -}}
{{- if .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }}true{{ end -}}
{{- end -}}

{{/* KEDA scales the listed workers: autoscaling on and the cluster serves keda.sh/v1alpha1
   ("true" or nothing); otherwise each Deployment keeps its own replica count. Values
   without `autoscaling` (0.3's, reused) ask for none. */}}
{{- define "bcw.keda" -}}
{{- if and (default dict .Values.autoscaling).enabled (.Capabilities.APIVersions.Has "keda.sh/v1alpha1") }}true{{ end -}}
{{- end -}}

{{- define "bcw.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "bcw.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The image: [registry/]repository, then @digest or :tag (the chart's appVersion by
   default). The registry is global.imageRegistry, else the one the repository names (its
   first part has a dot or a port, or is localhost: 0.3's registry.example.com/platform/
   bc-workers), else image.registry, else none: image.registry never moves a repository
   that names its own, and no image ever has two registries. */}}
{{- define "bcw.image" -}}
{{- $image := .Values.image -}}
{{- $repository := $image.repository -}}
{{- $parts := splitList "/" $repository -}}
{{- $first := first $parts -}}
{{- $named := and (gt (len $parts) 1) (or (contains "." $first) (contains ":" $first) (eq $first "localhost")) -}}
{{- $registry := default "" $image.registry -}}
{{- if $named }}{{ $repository = join "/" (rest $parts) }}{{ $registry = $first }}{{ end -}}
{{- with .Values.global }}{{ with .imageRegistry }}{{ $registry = . }}{{ end }}{{ end -}}
{{- if $registry }}{{ trimSuffix "/" $registry }}/{{ end }}{{ $repository }}
{{- if $image.digest }}@{{ $image.digest }}{{ else }}:{{ default .Chart.AppVersion $image.tag }}{{ end -}}
{{- end -}}

{{/* Every pod's pull secrets: imagePullSecrets and global.imagePullSecrets, each a
   name or {name: …}, once each. */}}
{{- define "bcw.imagePullSecrets" -}}
{{- $names := list -}}
{{- $global := list -}}
{{- with .Values.global }}{{ $global = default list .imagePullSecrets }}{{ end -}}
{{- range concat (default list .Values.imagePullSecrets) $global -}}
{{- if kindIs "string" . }}{{ $names = append $names . }}{{ else }}{{ $names = append $names .name }}{{ end -}}
{{- end -}}
{{- with ($names | compact | uniq) -}}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end -}}
{{- end -}}

{{- define "bcw.databaseSecret" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else -}}
{{- printf "%s-database" (include "bcw.fullname" .) -}}
{{- end -}}
{{- end -}}

{{/* Where a pod's database URL and NATS login come from: (dict "root" $ "database" <a
   database block or nil> "nats" <a nats block or nil>) gives "dbSecret|dbKey|natsSecret|natsKey|natsType",
   the pod's own Secrets first, then the shared ones (database.*, nats.credentials). */}}
{{/* A worker's Secrets must be its own unless allowSharedCredentials (dict "root" $
   "worker" name "spec" its values): fails the render naming the value to set. */}}
{{- define "bcw.ownCredentials" -}}
{{- $v := .root.Values -}}
{{- if not $v.allowSharedCredentials -}}
{{- $path := default (printf "workers.%s" .worker) .path -}}
{{- if not (and .spec.database .spec.database.existingSecret) -}}
{{- fail (printf "%s.database.existingSecret is empty: it would log in to PostgreSQL with the shared (owner) URL; give it a login of its own (docs/kubernetes.md), or set allowSharedCredentials: true" $path) -}}
{{- end -}}
{{- if and $v.nats.credentials.existingSecret (not (and .spec.nats .spec.nats.existingSecret)) -}}
{{- fail (printf "%s.nats.existingSecret is empty: it would log in to NATS with the shared nats.credentials; give it its own (bcw auth nats), or set allowSharedCredentials: true" $path) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "bcw.secrets" -}}
{{- $v := .root.Values -}}
{{- $dbSecret := include "bcw.databaseSecret" .root -}}
{{- $dbKey := ternary $v.database.existingSecretKey "url" (ne $v.database.existingSecret "") -}}
{{- with .database }}{{ if .existingSecret }}{{ $dbSecret = .existingSecret }}{{ $dbKey = default "url" .existingSecretKey }}{{ end }}{{ end -}}
{{- $natsSecret := $v.nats.credentials.existingSecret -}}
{{- $natsKey := $v.nats.credentials.existingSecretKey -}}
{{- $natsType := "creds" -}}
{{- with .nats }}{{ if .existingSecret }}{{ $natsSecret = .existingSecret }}{{ $natsKey = .existingSecretKey }}{{ $natsType = .type }}{{ end }}{{ end -}}
{{- printf "%s|%s|%s|%s|%s" $dbSecret $dbKey $natsSecret $natsKey $natsType -}}
{{- end -}}

{{/* The environment every container gets. Call with (dict "root" $ "service" "bcw-liveness"
   "secrets" (include "bcw.secrets" …)), and "extra": a container's own variables. A
   variable of extraEnv or "extra" replaces the chart's of the same name (a container's
   own wins over extraEnv): each name is set once. */}}
{{- define "bcw.env" -}}
{{- $overrides := concat (default list .root.Values.extraEnv) (default list .extra) -}}
{{- $names := list -}}
{{- range $overrides }}{{ $names = append $names .name }}{{ end -}}
{{- $env := list -}}
{{- range (include "bcw.envBase" . | fromYamlArray) }}
{{- if not (has .name $names) }}{{ $env = append $env . }}{{ end }}
{{- end }}
{{- range $i, $e := $overrides }}
{{- $later := false }}
{{- range $j, $f := $overrides }}{{ if and (gt $j $i) (eq $f.name $e.name) }}{{ $later = true }}{{ end }}{{ end }}
{{- if not $later }}{{ $env = append $env $e }}{{ end }}
{{- end }}
{{- toYaml $env }}
{{- end -}}

{{- define "bcw.envBase" -}}
{{- $v := .root.Values -}}
{{- $s := splitList "|" .secrets -}}
{{- $db := or (not (hasKey . "database")) .database -}}
{{- $bus := or (not (hasKey . "nats")) .nats -}}
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
{{- if $db }}
- name: BCW_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ index $s 0 }}
      key: {{ index $s 1 }}
- name: BCW_DATABASE_POOL_MAX
  value: {{ $v.database.poolMax | quote }}
- name: BCW_DATABASE_STATEMENT_CACHE_SIZE
  value: {{ $v.database.statementCacheSize | quote }}
{{- if include "bcw.pgTlsSecret" .root }}
{{- /* the standard libpq names, read by asyncpg when the URL names no sslrootcert */}}
- name: PGSSLROOTCERT
  value: /etc/bcw/pg-tls/ca.crt
{{- if $v.database.tls.mutual }}
- name: PGSSLCERT
  value: /etc/bcw/pg-tls/tls.crt
- name: PGSSLKEY
  value: /etc/bcw/pg-tls/tls.key
{{- end }}
{{- with $v.database.tls.mode }}
- name: PGSSLMODE
  value: {{ . | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- if $bus }}
{{- /* a new install gives each gateway its own facts stream; an upgrade keeps the layout the streams have */}}
{{- if and .root.Release.IsInstall (not $v.nats.factsGateways) (not $v.nats.oneFactsStream) }}
{{- fail "nats.factsGateways is empty: a new install gives each gateway a facts stream of its own; list every gateway's id (bcw auth nats --gateways), or set nats.oneFactsStream: true for one facts stream shared by all, which one gateway can fill by bytes (docs/kubernetes.md)" -}}
{{- end }}
{{- if and $v.nats.factsGateways $v.nats.oneFactsStream }}
{{- fail "nats.oneFactsStream is true and nats.factsGateways lists gateways: choose one" -}}
{{- end }}
- name: BCW_NATS_URL
  value: {{ $v.nats.url | quote }}
- name: BCW_NATS_STREAM_REPLICAS
  value: {{ $v.nats.streamReplicas | quote }}
- name: BCW_NATS_STREAM_MAX_BYTES
  value: {{ $v.nats.streamMaxBytes | int64 | quote }}
- name: BCW_NATS_STREAM_MAX_MSGS
  value: {{ $v.nats.streamMaxMsgs | int64 | quote }}
- name: BCW_NATS_MAX_MSG_SIZE
  value: {{ $v.nats.maxMsgSize | int64 | quote }}
- name: BCW_NATS_STREAM_MAX_CONSUMERS
  value: {{ $v.nats.streamMaxConsumers | int64 | quote }}
- name: BCW_NATS_NOTICES_MAX_CONSUMERS
  value: {{ $v.nats.noticesMaxConsumers | int64 | quote }}
- name: BCW_NATS_DEAD_LETTERS_PER_SOURCE
  value: {{ $v.nats.deadLettersPerSource | int64 | quote }}
- name: BCW_NATS_GATEWAYS
  value: {{ join "," $v.nats.gateways | quote }}
- name: BCW_NATS_SUBSCRIBERS
  value: {{ join "," $v.nats.subscribers | quote }}
- name: BCW_NATS_FACTS_GATEWAYS
  value: {{ join "," $v.nats.factsGateways | quote }}
- name: BCW_NATS_FACTS_BYTES_PER_GATEWAY
  value: {{ $v.nats.factsBytesPerGateway | int64 | quote }}
- name: BCW_NATS_FACTS_MSGS_PER_GATEWAY
  value: {{ $v.nats.factsMsgsPerGateway | int64 | quote }}
- name: BCW_NATS_FACTS_MAX_AGE
  value: {{ $v.nats.retention.facts | quote }}
- name: BCW_NATS_EVENTS_MAX_AGE
  value: {{ $v.nats.retention.events | quote }}
- name: BCW_NATS_NOTICES_MAX_AGE
  value: {{ $v.nats.retention.notices | quote }}
- name: BCW_NATS_DEAD_MAX_AGE
  value: {{ $v.nats.retention.deadLetters | quote }}
- name: BCW_NATS_EVENTS_MAX_BYTES
  value: {{ $v.nats.retention.eventsBytes | int64 | quote }}
- name: BCW_NATS_DEAD_MAX_BYTES
  value: {{ $v.nats.retention.deadLettersBytes | int64 | quote }}
{{- if index $s 2 }}
- name: {{ ternary "BCW_NATS_NKEY_SEED_FILE" "BCW_NATS_CREDS_FILE" (eq (index $s 4) "nkey") }}
  value: /etc/bcw/nats/{{ index $s 3 }}
{{- end }}
{{- end }}
{{- if and $bus $v.nats.tls.existingSecret }}
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
- name: OTEL_EXPORTER_OTLP_PROTOCOL
  value: {{ $v.otel.protocol | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ $v.otel.sampler | quote }}
{{- if hasSuffix "traceidratio" $v.otel.sampler }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ $v.otel.samplerRatio | toString | quote }}
{{- end }}
{{- end }}
{{- end -}}

{{/* The Secret of PostgreSQL's CA (database.tls.existingSecret), or nothing; values
   without database.tls (an older release's) give nothing. */}}
{{- define "bcw.pgTlsSecret" -}}
{{- with .Values.database.tls }}{{ .existingSecret }}{{ end -}}
{{- end -}}

{{/* Call with (dict "root" $ "secrets" (include "bcw.secrets" …)); "nats" false or
   "database" false: a container that does not reach that server mounts none of its files. */}}
{{- define "bcw.volumeMounts" -}}
{{- $s := splitList "|" .secrets -}}
{{- $bus := or (not (hasKey . "nats")) .nats -}}
{{- $db := or (not (hasKey . "database")) .database -}}
- name: tmp
  mountPath: /tmp
{{- with .root.Values.extraVolumeMounts }}
{{ toYaml . }}
{{- end }}
{{- if and $bus (index $s 2) }}
- name: nats-credentials
  mountPath: /etc/bcw/nats
  readOnly: true
{{- end }}
{{- if and $bus .root.Values.nats.tls.existingSecret }}
- name: nats-tls
  mountPath: /etc/bcw/tls
  readOnly: true
{{- end }}
{{- if and $db (include "bcw.pgTlsSecret" .root) }}
- name: pg-tls
  mountPath: /etc/bcw/pg-tls
  readOnly: true
{{- end }}
{{- end -}}

{{/* Call with (dict "root" $ "secrets" (include "bcw.secrets" …)); "database" false: a
   pod none of whose containers reaches PostgreSQL gets no PostgreSQL TLS files. */}}
{{- define "bcw.volumes" -}}
{{- $s := splitList "|" .secrets -}}
{{- $db := or (not (hasKey . "database")) .database -}}
- name: tmp
  emptyDir: {sizeLimit: 64Mi}
{{- with .root.Values.extraVolumes }}
{{ toYaml . }}
{{- end }}
{{- if index $s 2 }}
- name: nats-credentials
  secret:
    secretName: {{ index $s 2 }}
    defaultMode: 0400
    items: [{key: {{ index $s 3 | quote }}, path: {{ index $s 3 | quote }}}]  # that key only
{{- end }}
{{- if .root.Values.nats.tls.existingSecret }}
- name: nats-tls
  secret:
    secretName: {{ .root.Values.nats.tls.existingSecret }}
    defaultMode: 0400
    items:
      - {key: ca.crt, path: ca.crt}
      {{- if .root.Values.nats.tls.mutual }}
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      {{- end }}
{{- end }}
{{- with (and $db (include "bcw.pgTlsSecret" .root)) }}
- name: pg-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0400
    items:
      - {key: ca.crt, path: ca.crt}
      {{- if $.root.Values.database.tls.mutual }}
      - {key: tls.crt, path: tls.crt}
      - {key: tls.key, path: tls.key}
      {{- end }}
{{- end }}
{{- end -}}

{{/* A worker pod's init container: waits, bounded, until the schema holds every migration
     of this release (`bcw migrate --wait`), so a pod of a new release never runs on the
     old schema while the migration Job runs beside it. The database only, as the worker.
     Call with (dict "root" $ "secrets" (include "bcw.secrets" …) "service" "bcw-<name>"). */}}
{{- define "bcw.waitForSchema" -}}
- name: wait-for-schema
  image: {{ include "bcw.image" .root }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  args: ["migrate", "--wait", {{ .root.Values.migrations.waitTimeout | quote }}]
  env:
    {{- include "bcw.env" (dict "root" .root "service" .service "secrets" .secrets "nats" false) | nindent 4 }}
  resources:
    {{- toYaml .root.Values.migrations.resources | nindent 4 }}
  securityContext:
    {{- toYaml .root.Values.securityContext | nindent 4 }}
  volumeMounts:
    {{- include "bcw.volumeMounts" (dict "root" .root "secrets" .secrets "nats" false) | nindent 4 }}
{{- end -}}

{{/* A duration as the workers read it (`500ms`, `45s`, `5m`, `2h`, `7d`, `1w`, a plain
   number is seconds) → seconds; "" when it is none (the schema refuses such a value). */}}
{{- define "bcw.seconds" -}}
{{- $text := trim (toString .) -}}
{{- $number := regexFind "^([0-9]+(\\.[0-9]*)?|\\.[0-9]+)" $text -}}
{{- $scale := get (dict "" 1.0 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 "d" 86400.0 "w" 604800.0) (trim (trimPrefix $number $text)) -}}
{{- if and $number (ne (toString $scale) "") }}{{ mulf (float64 $number) $scale }}{{ end -}}
{{- end -}}

{{/* The retention values checked as the workers check them at start (runtime_settings.py),
   so an incoherent one fails the render with one line instead of every pod at start:
   each stream keeps at least 2 minutes (JetStream's duplicate window); the facts less long
   than the inbox rows (BCW_RETENTION_PROCESSED_FACTS, 25h unless extraEnv or a worker's
   env sets it), or a redelivered fact would be applied twice; node events and session
   history at least a day. Renders nothing. */}}
{{- define "bcw.checkRetention" -}}
{{- $v := .Values -}}
{{- $retention := default dict (default dict $v.nats).retention -}}
{{- range $key := list "facts" "events" "notices" "deadLetters" }}
{{- with index $retention $key }}
{{- $s := include "bcw.seconds" . }}
{{- if and $s (lt (float64 $s) 120.0) }}
{{- fail (printf "nats.retention.%s (%v) is below 2m: a stream keeps at least JetStream's 2-minute duplicate window" $key .) }}
{{- end }}
{{- end }}
{{- end }}
{{- $envs := list (default list $v.extraEnv) -}}
{{- range $worker, $spec := default dict $v.workers }}
{{- if and $spec $spec.enabled }}{{ $envs = append $envs (concat (default list $v.extraEnv) (default list $spec.env)) }}{{ end }}
{{- end }}
{{- $facts := include "bcw.seconds" (default "24h" $retention.facts) -}}
{{- range $env := $envs }}
{{- $set := dict "BCW_RETENTION_PROCESSED_FACTS" "25h" }}
{{- range $env }}{{ if and (kindIs "map" .) (hasKey . "value") }}{{ $_ := set $set .name (toString .value) }}{{ end }}{{ end }}
{{- $kept := include "bcw.seconds" $set.BCW_RETENTION_PROCESSED_FACTS }}
{{- if and $facts $kept (le (float64 $kept) (float64 $facts)) }}
{{- fail (printf "nats.retention.facts (%v) must be below BCW_RETENTION_PROCESSED_FACTS (%s): a fact redelivered after its inbox row was pruned would be applied twice; set BCW_RETENTION_PROCESSED_FACTS above it in extraEnv (a worker's env wins there)" (default "24h" $retention.facts) $set.BCW_RETENTION_PROCESSED_FACTS) }}
{{- end }}
{{- range $name := list "BCW_RETENTION_NODE_EVENTS" "BCW_RETENTION_SESSION_HISTORY" }}
{{- with index $set $name }}
{{- $s := include "bcw.seconds" . }}
{{- if and $s (lt (float64 $s) 86400.0) }}
{{- fail (printf "%s (%s) is below 1d: a worker's login may not delete a younger row" $name .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
