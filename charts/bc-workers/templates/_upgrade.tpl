{{/* What an upgrade with `--reuse-values` needs. Helm then renders with the previous
   release's values in place of this chart's defaults (values.yaml is not read), so a
   value added since is absent: every template starts with `bcw.enabled`, which fills in
   each one's default from `bcw.addedValues` (a value the release has is kept, `false`
   and "" too) and then says whether to render at all (`enabled` absent is on).
   tests/chart/test_chart_upgrade.py checks the list against values.yaml and the previous
   release's chart: a value added to values.yaml is added here. */}}

{{- define "bcw.enabled" -}}
{{- include "bcw.fill" (dict "dst" .Values "src" (include "bcw.addedValues" . | fromYaml)) -}}
{{- if .Values.enabled }}true{{ end -}}
{{- end -}}

{{/* Sets each key of src that dst lacks, recursing into maps both have; never replaces. */}}
{{- define "bcw.fill" -}}
{{- $dst := .dst -}}
{{- range $key, $value := .src -}}
{{- if not (hasKey $dst $key) -}}
{{- $_ := set $dst $key $value -}}
{{- else if and (kindIs "map" $value) (kindIs "map" (index $dst $key)) -}}
{{- include "bcw.fill" (dict "dst" (index $dst $key) "src" $value) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The values added since the previous release (0.3.0), with values.yaml's defaults. */}}
{{- define "bcw.addedValues" -}}
enabled: true
image:
  registry: ghcr.io
  digest: ''
global:
  imagePullSecrets: []
nats:
  deadLettersPerSource: 10000
  gateways: []
  subscribers: []
  factsGateways: []
  oneFactsStream: false
  factsBytesPerGateway: 4294967296
  factsMsgsPerGateway: 5000000
  noticesMaxConsumers: 4096
  retention:
    facts: 24h
    events: 7d
    notices: 1h
    deadLetters: 14d
    eventsBytes: 0
    deadLettersBytes: 1073741824
otel:
  sampler: parentbased_traceidratio
  samplerRatio: '1.0'
migrations:
  helloProof: ''
  legacyGatewayRole: false
relay:
  nodeSelector: {}
  tolerations: []
  affinity: {}
  priorityClassName: ''
  podAnnotations: {}
  podLabels: {}
  probes: {}
prometheusRule:
  factsStreamFullRatio: 0.8
  livenessLagSeconds: 15
  loopUnheldFor: 2m
  workerAbsentFor: 5m
autoscaling:
  enabled: false
  workers:
  - labeler
  - quarantine
  - recorder
  - replay
  - liveness
  natsMonitoringEndpoint: nats-headless.nats.svc.cluster.local:8222
  account: $G
  useHttps: false
  minReplicas: 2
  maxReplicas: 8
  lagThreshold: 1000
  activationLagThreshold: 0
  pollingInterval: 15
  cooldownPeriod: 300
commonAnnotations: {}
commonLabels: {}
database:
  tls:
    existingSecret: ''
    mode: verify-full
    mutual: false
defaults:
  probes:
    liveness: {}
    readiness: {}
    startup: {}
  revisionHistoryLimit: 5
extraObjects: []
networkPolicy:
  extraEgress: []
  extraIngress: []
podDisruptionBudget:
  minAvailable: null
  unhealthyPodEvictionPolicy: ''
serviceMonitor:
  metricRelabelings: []
  relabelings: []
  scrapeTimeout: ''
tests:
  nats:
    existingSecret: ''
    existingSecretKey: seed.nk
    type: nkey
  resources:
    limits:
      memory: 256Mi
    requests:
      cpu: 10m
      memory: 64Mi
workers:
  labeler:
    podAnnotations: {}
    podLabels: {}
    probes: {}
  liveness:
    podAnnotations: {}
    podLabels: {}
    probes: {}
  quarantine:
    podAnnotations: {}
    podLabels: {}
    probes: {}
  recorder:
    podAnnotations: {}
    podLabels: {}
    probes: {}
  replay:
    podAnnotations: {}
    podLabels: {}
    probes: {}
{{- end -}}
