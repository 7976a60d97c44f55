{{/* Names, labels, images and the checks every template shares. */}}

{{- define "eos-suite.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "eos-suite.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* A component's resource name: <fullname>-<component>. Args: (list $ "component"). */}}
{{- define "eos-suite.componentName" -}}
{{- $root := index . 0 -}}
{{- printf "%s-%s" (include "eos-suite.fullname" $root | trunc 45 | trimSuffix "-") (index . 1) }}
{{- end }}

{{- define "eos-suite.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "eos-suite.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: eos-suite
{{- end }}

{{/* Selector labels of one component. Args: (list $ "component"). */}}
{{- define "eos-suite.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "eos-suite.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* All labels of one component. Args: (list $ "component"). */}}
{{- define "eos-suite.componentLabels" -}}
{{ include "eos-suite.labels" (index . 0) }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end }}

{{/* An image reference. Args: (list $ "binary" .Values.<component>.image.repository). */}}
{{- define "eos-suite.image" -}}
{{- $root := index . 0 -}}
{{- $repository := default (printf "eos-suite/%s" (index . 1)) (index . 2) -}}
{{- $tag := default $root.Chart.AppVersion $root.Values.image.tag -}}
{{- if $root.Values.image.registry }}
{{- printf "%s/%s:%s" (trimSuffix "/" $root.Values.image.registry) $repository $tag }}
{{- else }}
{{- printf "%s:%s" $repository $tag }}
{{- end }}
{{- end }}

{{- define "eos-suite.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "eos-suite.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "eos-suite.databaseSecretName" -}}
{{- default (printf "%s-database" (include "eos-suite.fullname" .)) .Values.database.existingSecret }}
{{- end }}

{{- define "eos-suite.dedupTokensSecretName" -}}
{{- default (printf "%s-dedup-tokens" (include "eos-suite.fullname" .)) .Values.dedup.auth.existingSecret }}
{{- end }}

{{- define "eos-suite.migrationSecretName" -}}
{{- default (printf "%s-database-owner" (include "eos-suite.fullname" .)) .Values.migration.existingSecret }}
{{- end }}

{{/* The provider URL dedup-service reconciles against. */}}
{{- define "eos-suite.providerUrl" -}}
{{- if .Values.dedup.providerUrl }}
{{- .Values.dedup.providerUrl }}
{{- else if .Values.providerSim.enabled }}
{{- printf "http://%s:%d" (include "eos-suite.componentName" (list . "provider-sim")) (int .Values.providerSim.port) }}
{{- end }}
{{- end }}

{{/*
outbox-relay's name (OUTBOX_RELAY_NAME): outboxRelay.relayName, else
<release namespace>-<full name>. Nothing in it changes on an upgrade or a pod restart, since the
position's key and the transactional.id come from it.
*/}}
{{- define "eos-suite.relayName" -}}
{{- default (printf "%s-%s" .Release.Namespace (include "eos-suite.fullname" .)) .Values.outboxRelay.relayName }}
{{- end }}

{{/* Whether any enabled service reads or writes PostgreSQL (and so needs DATABASE_URL). */}}
{{- define "eos-suite.usesDatabase" -}}
{{- if or .Values.sink.enabled .Values.dedup.enabled .Values.outboxRelay.enabled .Values.paymentsApi.enabled }}true{{ end }}
{{- end }}

{{/* DATABASE_URL of the runtime role, from its Secret. */}}
{{- define "eos-suite.databaseEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "eos-suite.databaseSecretName" . }}
      key: {{ .Values.database.secretKey }}
- name: EOS_SKIP_MIGRATIONS
  value: "true"
{{- end }}

{{/*
The Kafka settings of every Kafka service: the bootstrap servers, the non-secret client
properties (EOS_KAFKA_PROPERTIES) and, from kafka.propertiesSecret, a properties file with the
secret ones (EOS_KAFKA_PROPERTIES_FILE), mounted by kafkaVolumeMount / kafkaVolume.
*/}}
{{- define "eos-suite.kafkaEnv" -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
{{- with .Values.kafka.clientProperties }}
- name: EOS_KAFKA_PROPERTIES
  value: {{ include "eos-suite.kafkaPropertiesList" . | quote }}
{{- end }}
{{- if .Values.kafka.propertiesSecret }}
- name: EOS_KAFKA_PROPERTIES_FILE
  value: /etc/eos-suite/kafka/kafka.properties
{{- end }}
{{- end }}

{{- define "eos-suite.kafkaPropertiesList" -}}
{{- $entries := list }}
{{- range $key, $value := . }}
{{- $entries = append $entries (printf "%s=%s" $key (toString $value)) }}
{{- end }}
{{- join ";" $entries }}
{{- end }}

{{- define "eos-suite.kafkaVolumeMount" -}}
{{- if .Values.kafka.propertiesSecret }}
- name: kafka-client
  mountPath: /etc/eos-suite/kafka
  readOnly: true
{{- end }}
{{- end }}

{{- define "eos-suite.kafkaVolume" -}}
{{- if .Values.kafka.propertiesSecret }}
- name: kafka-client
  secret:
    secretName: {{ .Values.kafka.propertiesSecret }}
{{- end }}
{{- end }}

{{/* Pod-level settings every pod shares. */}}
{{- define "eos-suite.podSpecCommon" -}}
serviceAccountName: {{ include "eos-suite.serviceAccountName" . }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml .Values.podSecurityContext | nindent 2 }}
{{- with .Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
Pod metadata every pod shares. Args: (list $ "component") or (list $ "component" dict), the dict
holding annotations of this pod on top of podAnnotations.
*/}}
{{- define "eos-suite.podMetadata" -}}
{{- $root := index . 0 -}}
{{- $annotations := $root.Values.podAnnotations | default dict -}}
{{- if gt (len .) 2 -}}
{{- $annotations = merge (deepCopy (index . 2)) $annotations -}}
{{- end -}}
labels:
  {{- include "eos-suite.selectorLabels" (list $root (index . 1)) | nindent 2 }}
  app.kubernetes.io/part-of: eos-suite
  {{- with $root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* The writable scratch directory a read-only root filesystem still needs. */}}
{{- define "eos-suite.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end }}
{{- define "eos-suite.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: 64Mi
{{- end }}

{{/*
Checks values.schema.json cannot express: they fail the render with a message saying what to
change. Called once, from the ServiceAccount template (always rendered).
*/}}
{{- define "eos-suite.validate" -}}
{{- if and (include "eos-suite.usesDatabase" .) (not .Values.database.existingSecret) (not .Values.database.url) }}
{{- fail "database: set database.existingSecret (a Secret holding the runtime role's DATABASE_URL) or database.url (the chart makes the Secret)" }}
{{- end }}
{{- if and .Values.migration.enabled (not .Values.migration.existingSecret) (not .Values.migration.url) }}
{{- fail "migration: set migration.existingSecret (a Secret holding the schema owner's DATABASE_URL) or migration.url (the chart makes a hook Secret)" }}
{{- end }}
{{- if le (int .Values.processor.terminationGracePeriodSeconds) (int .Values.processor.transactionTimeoutSeconds) }}
{{- fail (printf "processor.terminationGracePeriodSeconds (%d) must be longer than processor.transactionTimeoutSeconds (%d): a pod killed mid-transaction leaves it open until the broker times it out" (int .Values.processor.terminationGracePeriodSeconds) (int .Values.processor.transactionTimeoutSeconds)) }}
{{- end }}
{{- if le (int .Values.sink.terminationGracePeriodSeconds) (int .Values.sink.shutdownTimeoutSeconds) }}
{{- fail (printf "sink.terminationGracePeriodSeconds (%d) must be longer than sink.shutdownTimeoutSeconds (%d), so SIGTERM can commit the open batch" (int .Values.sink.terminationGracePeriodSeconds) (int .Values.sink.shutdownTimeoutSeconds)) }}
{{- end }}
{{- if le (int .Values.outboxRelay.terminationGracePeriodSeconds) (int .Values.outboxRelay.transactionTimeoutSeconds) }}
{{- fail (printf "outboxRelay.terminationGracePeriodSeconds (%d) must be longer than outboxRelay.transactionTimeoutSeconds (%d): a relay killed mid-transaction leaves it open, holding back read_committed readers, until the broker times it out" (int .Values.outboxRelay.terminationGracePeriodSeconds) (int .Values.outboxRelay.transactionTimeoutSeconds)) }}
{{- end }}
{{- if and .Values.paymentsApi.enabled (not .Values.outboxRelay.enabled) }}
{{- fail "paymentsApi.enabled needs outboxRelay.enabled: without the relay the payments' events stay in the outbox and never reach Kafka" }}
{{- end }}
{{- if le (int .Values.dedup.terminationGracePeriodSeconds) (int .Values.dedup.shutdownTimeoutSeconds) }}
{{- fail (printf "dedup.terminationGracePeriodSeconds (%d) must be longer than dedup.shutdownTimeoutSeconds (%d), so SIGTERM can drain in-flight calls" (int .Values.dedup.terminationGracePeriodSeconds) (int .Values.dedup.shutdownTimeoutSeconds)) }}
{{- end }}
{{- end }}

{{/*
The OpenTelemetry environment of every service: where spans go and the parent-based sampler, so
an event's trace is whole or absent (docs/OBSERVABILITY.md). Nothing when no endpoint is set.
*/}}
{{- define "eos-suite.otelEnv" -}}
{{- if .Values.telemetry.otlpEndpoint -}}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.telemetry.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: parentbased_traceidratio
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ .Values.telemetry.samplingRatio | toString | quote }}
{{- end -}}
{{- end }}
