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

{{/*
An image reference: [<registry>/]<repository>@<digest> when the component's image has a digest
(it wins over any tag: the digest is what runs), else [<registry>/]<repository>:<tag>, the tag
being the component's, else image.tag, else the chart's appVersion.
Args: (list $ "binary" .Values.<component>.image).
*/}}
{{- define "eos-suite.image" -}}
{{- $root := index . 0 -}}
{{- $image := index . 2 -}}
{{- $repository := default (printf "eos-suite/%s" (index . 1)) $image.repository -}}
{{- if $root.Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" $root.Values.image.registry) $repository }}
{{- end }}
{{- if $image.digest }}
{{- printf "%s@%s" $repository $image.digest }}
{{- else }}
{{- printf "%s:%s" $repository ($image.tag | default $root.Values.image.tag | default $root.Chart.AppVersion) }}
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

{{/*
A role's database credentials: DATABASE_URL from its Secret and, with a password Secret, the
password as a file (DATABASE_PASSWORD_FILE; the binaries put it into the URL at start-up, docs/security.md
"PostgreSQL"), mounted by databaseCredentialsVolumeMount / databaseCredentialsVolume. Args: (dict
"secretName" … "secretKey" … "passwordSecret" <database or migration>.passwordSecret "volume"
"<volume name>").
*/}}
{{- define "eos-suite.databaseCredentialsEnv" -}}
- name: DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .secretKey }}
{{- if .passwordSecret.name }}
- name: DATABASE_PASSWORD_FILE
  value: /etc/eos-suite/{{ .volume }}/password
{{- end }}
{{- end }}

{{- define "eos-suite.databaseCredentialsVolumeMount" -}}
{{- if .passwordSecret.name }}
- name: {{ .volume }}
  mountPath: /etc/eos-suite/{{ .volume }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "eos-suite.databaseCredentialsVolume" -}}
{{- if .passwordSecret.name }}
- name: {{ .volume }}
  secret:
    secretName: {{ .passwordSecret.name }}
    items:
      - key: {{ .passwordSecret.key }}
        path: password
{{- end }}
{{- end }}

{{/* The runtime role's credentials (database.*). */}}
{{- define "eos-suite.runtimeCredentials" -}}
{{- toYaml (dict "secretName" (include "eos-suite.databaseSecretName" .) "secretKey" .Values.database.secretKey "passwordSecret" .Values.database.passwordSecret "volume" "database-password") }}
{{- end }}

{{/* The schema owner's credentials (migration.*). */}}
{{- define "eos-suite.ownerCredentials" -}}
{{- toYaml (dict "secretName" (include "eos-suite.migrationSecretName" .) "secretKey" .Values.migration.secretKey "passwordSecret" .Values.migration.passwordSecret "volume" "database-owner-password") }}
{{- end }}

{{/* The runtime role's database environment of every service with tables. */}}
{{- define "eos-suite.databaseEnv" -}}
{{- include "eos-suite.databaseCredentialsEnv" (include "eos-suite.runtimeCredentials" . | fromYaml) }}
- name: EOS_SKIP_MIGRATIONS
  value: "true"
{{- end }}

{{/*
The volumes of a pod that uses the database: the password file (runtime role or, with "owner",
the schema owner) and the CA of PostgreSQL's server certificate (database.tls.ca), at
/etc/eos-suite/postgres-ca/ca.crt, which the URL names in sslrootcert. Args: (list $ "runtime")
or (list $ "owner").
*/}}
{{- define "eos-suite.databaseVolumeMounts" -}}
{{- $root := index . 0 -}}
{{- $credentials := include (ternary "eos-suite.ownerCredentials" "eos-suite.runtimeCredentials" (eq (index . 1) "owner")) $root | fromYaml -}}
{{- include "eos-suite.databaseCredentialsVolumeMount" $credentials }}
{{- if or $root.Values.database.tls.ca.existingSecret $root.Values.database.tls.ca.existingConfigMap }}
- name: postgres-ca
  mountPath: /etc/eos-suite/postgres-ca
  readOnly: true
{{- end }}
{{- end }}

{{- define "eos-suite.databaseVolumes" -}}
{{- $root := index . 0 -}}
{{- $credentials := include (ternary "eos-suite.ownerCredentials" "eos-suite.runtimeCredentials" (eq (index . 1) "owner")) $root | fromYaml -}}
{{- include "eos-suite.databaseCredentialsVolume" $credentials }}
{{- with $root.Values.database.tls.ca }}
{{- if .existingSecret }}
- name: postgres-ca
  secret:
    secretName: {{ .existingSecret }}
    items:
      - key: {{ .key }}
        path: ca.crt
{{- else if .existingConfigMap }}
- name: postgres-ca
  configMap:
    name: {{ .existingConfigMap }}
    items:
      - key: {{ .key }}
        path: ca.crt
{{- end }}
{{- end }}
{{- end }}

{{/*
The Kafka settings of every Kafka service: the bootstrap servers, the non-secret client
properties (EOS_KAFKA_PROPERTIES: kafka.clientProperties plus the locations of the certificates
of kafka.tls) and, from kafka.propertiesSecret, a properties file with the secret ones
(EOS_KAFKA_PROPERTIES_FILE), mounted by kafkaVolumeMount / kafkaVolume.
*/}}
{{- define "eos-suite.kafkaEnv" -}}
- name: KAFKA_BOOTSTRAP_SERVERS
  value: {{ .Values.kafka.bootstrapServers | quote }}
{{- $properties := deepCopy (.Values.kafka.clientProperties | default dict) }}
{{- if .Values.kafka.tls.ca.existingSecret }}
{{- $_ := set $properties "ssl.ca.location" "/etc/eos-suite/kafka-ca/ca.crt" }}
{{- end }}
{{- if .Values.kafka.tls.clientCert.existingSecret }}
{{- $_ := set $properties "ssl.certificate.location" "/etc/eos-suite/kafka-client-cert/tls.crt" }}
{{- $_ := set $properties "ssl.key.location" "/etc/eos-suite/kafka-client-cert/tls.key" }}
{{- end }}
{{- with $properties }}
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
{{- if .Values.kafka.tls.ca.existingSecret }}
- name: kafka-ca
  mountPath: /etc/eos-suite/kafka-ca
  readOnly: true
{{- end }}
{{- if .Values.kafka.tls.clientCert.existingSecret }}
- name: kafka-client-cert
  mountPath: /etc/eos-suite/kafka-client-cert
  readOnly: true
{{- end }}
{{- end }}

{{/* The Secrets' keys are mapped to fixed file names, so any Secret layout works (Strimzi's
<cluster>-cluster-ca-cert has ca.crt, a KafkaUser's Secret user.crt and user.key). */}}
{{- define "eos-suite.kafkaVolume" -}}
{{- if .Values.kafka.propertiesSecret }}
- name: kafka-client
  secret:
    secretName: {{ .Values.kafka.propertiesSecret }}
{{- end }}
{{- with .Values.kafka.tls.ca }}
{{- if .existingSecret }}
- name: kafka-ca
  secret:
    secretName: {{ .existingSecret }}
    items:
      - key: {{ .key }}
        path: ca.crt
{{- end }}
{{- end }}
{{- with .Values.kafka.tls.clientCert }}
{{- if .existingSecret }}
- name: kafka-client-cert
  secret:
    secretName: {{ .existingSecret }}
    items:
      - key: {{ .certificateKey }}
        path: tls.crt
      - key: {{ .privateKeyKey }}
        path: tls.key
{{- end }}
{{- end }}
{{- end }}

{{/*
Pod-level settings every service pod shares, and its scheduling: affinity (when set, for every
pod) wins over the component's podAntiAffinityPreset; the component's topologySpreadConstraints
select its own pods unless they say otherwise. Args: (list $ "component" .Values.<component>).
*/}}
{{- define "eos-suite.podSpecCommon" -}}
{{- $root := index . 0 -}}
{{- $component := index . 1 -}}
{{- $values := index . 2 -}}
{{- $selector := include "eos-suite.selectorLabels" (list $root $component) | fromYaml -}}
serviceAccountName: {{ include "eos-suite.serviceAccountName" $root }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.image.pullSecrets }}
imagePullSecrets:
  {{- range . }}
  - name: {{ . }}
  {{- end }}
{{- end }}
{{- with $root.Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $root.Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if $root.Values.affinity }}
affinity:
  {{- toYaml $root.Values.affinity | nindent 2 }}
{{- else if $values.podAntiAffinityPreset }}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" $selector) }}
affinity:
  podAntiAffinity:
    {{- if eq $values.podAntiAffinityPreset "hard" }}
    requiredDuringSchedulingIgnoredDuringExecution:
      {{- toYaml (list $term) | nindent 6 }}
    {{- else }}
    preferredDuringSchedulingIgnoredDuringExecution:
      {{- toYaml (list (dict "weight" 1 "podAffinityTerm" $term)) | nindent 6 }}
    {{- end }}
{{- end }}
{{- with $values.topologySpreadConstraints }}
{{- $constraints := list }}
{{- range . }}
{{- $constraint := deepCopy . }}
{{- if not (hasKey $constraint "labelSelector") }}
{{- $_ := set $constraint "labelSelector" (dict "matchLabels" $selector) }}
{{- end }}
{{- $constraints = append $constraints $constraint }}
{{- end }}
topologySpreadConstraints:
  {{- toYaml $constraints | nindent 2 }}
{{- end }}
{{- with $root.Values.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- end }}

{{/*
A probe: the chart's handler with the component's timings (<component>.livenessProbe and the
like; `enabled` only switches a startup probe). Args: (list <handler dict> <timings>).
*/}}
{{- define "eos-suite.probe" -}}
{{- toYaml (merge (omit (index . 1) "enabled") (index . 0)) }}
{{- end }}

{{/*
The environment every service container shares after its own: the log filter (RUST_LOG:
<component>.logLevel, else logLevel), the OpenTelemetry settings, then the component's extraEnv
(last, so it overrides). Args: (list $ .Values.<component>).
*/}}
{{- define "eos-suite.commonEnv" -}}
{{- $root := index . 0 -}}
{{- $values := index . 1 -}}
- name: RUST_LOG
  value: {{ $values.logLevel | default $root.Values.logLevel | quote }}
{{- with include "eos-suite.otelEnv" $root }}
{{ . }}
{{- end }}
{{- with $values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{/*
checksum/secret of a pod: a digest of the chart-made Secrets it reads (the runtime role's
database Secret made from database.url, dedup-service's tokens), so a change to one rolls the
pods that read it at start-up. Secrets you manage (existingSecret) are not seen by the chart:
roll the pods yourself after changing one (deploy/helm/eos-suite/README.md "Secrets and restarts"). Empty when
the pod reads no chart-made Secret. Args: (list $ (list "database" "dedupTokens")), naming what the pod reads.
*/}}
{{- define "eos-suite.secretChecksum" -}}
{{- $root := index . 0 -}}
{{- $lines := list }}
{{- range index . 1 }}
{{- if and (eq . "database") (not $root.Values.database.existingSecret) }}
{{- $lines = append $lines (printf "%s/%s=%s" (include "eos-suite.databaseSecretName" $root) $root.Values.database.secretKey $root.Values.database.url) }}
{{- else if and (eq . "dedupTokens") (not $root.Values.dedup.auth.existingSecret) }}
{{- $tokens := include "eos-suite.dedupTokens" $root | fromYaml }}
{{- range $key := list "client-token" "operator-token" }}
{{- $lines = append $lines (printf "%s/%s=%s" (include "eos-suite.dedupTokensSecretName" $root) $key (index $tokens $key)) }}
{{- end }}
{{- end }}
{{- end }}
{{- with $lines }}
{{- join "\n" . | sha256sum }}
{{- end }}
{{- end }}

{{/*
dedup-service's tokens when the chart makes them (base64): the Secret's own when it exists (read
back, so an upgrade keeps them), else random. Made once per render (kept in .Values._rendered),
so the Secret and every pod's checksum/secret see the same tokens.
*/}}
{{- define "eos-suite.dedupTokens" -}}
{{- if not (hasKey .Values "_rendered") }}
{{- $_ := set .Values "_rendered" dict }}
{{- end }}
{{- if not (hasKey .Values._rendered "dedupTokens") }}
{{- $existing := lookup "v1" "Secret" .Release.Namespace (include "eos-suite.dedupTokensSecretName" .) }}
{{- if $existing }}
{{- $_ := set .Values._rendered "dedupTokens" (dict "client-token" (index $existing.data "client-token") "operator-token" (index $existing.data "operator-token")) }}
{{- else }}
{{- $_ := set .Values._rendered "dedupTokens" (dict "client-token" (randAlphaNum 40 | b64enc) "operator-token" (randAlphaNum 40 | b64enc)) }}
{{- end }}
{{- end }}
{{- toYaml .Values._rendered.dedupTokens }}
{{- end }}

{{/* The container's extra volume mounts. Args: .Values.<component> (or .Values.migration). */}}
{{- define "eos-suite.extraVolumeMounts" -}}
{{- with .extraVolumeMounts }}{{ toYaml . }}{{ end }}
{{- end }}

{{- define "eos-suite.extraVolumes" -}}
{{- with .extraVolumes }}{{ toYaml . }}{{ end }}
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
{{- if and (eq .Values.outboxRelay.mode "logical") (eq .Values.outboxRelay.guarantee "at-least-once") }}
{{- fail "outboxRelay.mode logical runs exactly-once only (its position is kept in Kafka next to its replication slot): set outboxRelay.mode xmin for at-least-once" }}
{{- end }}
{{- if and .Values.outboxRelay.enabled .Values.outboxRelay.valueSubjects (not (include "eos-suite.relayUsesRegistry" .)) }}
{{- fail (printf "outboxRelay.valueSubjects (%s) needs a registry outboxRelay.valueFormat (avro, protobuf or json-schema), not %s: the relay refuses subjects for values it writes as json; set outboxRelay.valueFormat or empty outboxRelay.valueSubjects" (keys .Values.outboxRelay.valueSubjects | sortAlpha | join ", ") .Values.outboxRelay.valueFormat) }}
{{- end }}
{{- if and .Values.processor.inputReaderSchema (ne .Values.processor.inputFormat "avro") }}
{{- fail (printf "processor.inputReaderSchema (%s) needs processor.inputFormat avro, not %s: a reader's schema resolves Avro writers' schemas only" .Values.processor.inputReaderSchema .Values.processor.inputFormat) }}
{{- end }}
{{- if and .Values.paymentsApi.enabled (not .Values.outboxRelay.enabled) }}
{{- fail "paymentsApi.enabled needs outboxRelay.enabled: without the relay the payments' events stay in the outbox and never reach Kafka" }}
{{- end }}
{{- if le (int .Values.dedup.terminationGracePeriodSeconds) (int .Values.dedup.shutdownTimeoutSeconds) }}
{{- fail (printf "dedup.terminationGracePeriodSeconds (%d) must be longer than dedup.shutdownTimeoutSeconds (%d), so SIGTERM can drain in-flight calls" (int .Values.dedup.terminationGracePeriodSeconds) (int .Values.dedup.shutdownTimeoutSeconds)) }}
{{- end }}
{{- include "eos-suite.validatePartitions" . }}
{{- include "eos-suite.validateProduction" . }}
{{- include "eos-suite.validateLookups" . }}
{{- end }}

{{/*
dedup.lookups against dedup.reconcileStrategies: a look-up is asked only for a target settled by
lookup (the default), and dedup-service refuses to start with one for a replay or none target.
A file that is not TOML is left to dedup-service, which says where.
*/}}
{{- define "eos-suite.validateLookups" -}}
{{- if and .Values.dedup.enabled .Values.dedup.lookups }}
{{- $strategies := .Values.dedup.reconcileStrategies | default dict }}
{{- $file := fromToml .Values.dedup.lookups }}
{{- if not (hasKey $file "Error") }}
{{- range $file.lookups | default list }}
{{- $target := toString (.target | default "") }}
{{- $strategy := get $strategies $target | default "lookup" }}
{{- if and $target (ne $strategy "lookup") }}
{{- fail (printf "dedup.lookups has a look-up for target %s, which dedup.reconcileStrategies settles by %s: a look-up is only asked for lookup targets; drop it or make the target lookup" $target $strategy) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
The OpenTelemetry environment of every service: where spans go and the sampler (otel.sampler,
by default the parent-based ratio sampler, so an event's trace is whole or absent:
docs/OBSERVABILITY.md) with its argument (samplerArg). Nothing when no endpoint is set.
*/}}
{{- define "eos-suite.otelEnv" -}}
{{- if .Values.telemetry.otlpEndpoint -}}
- name: OTEL_EXPORTER_OTLP_ENDPOINT
  value: {{ .Values.telemetry.otlpEndpoint | quote }}
- name: OTEL_TRACES_SAMPLER
  value: {{ .Values.otel.sampler | quote }}
{{- with include "eos-suite.samplerArg" . }}
- name: OTEL_TRACES_SAMPLER_ARG
  value: {{ . | quote }}
{{- end }}
{{- end -}}
{{- end }}

{{/*
OTEL_TRACES_SAMPLER_ARG: a ratio sampler's share of traces, otel.samplerArg or else
telemetry.samplingRatio (the older key, kept); the other samplers take none.
*/}}
{{- define "eos-suite.samplerArg" -}}
{{- if has .Values.otel.sampler (list "traceidratio" "parentbased_traceidratio") }}
{{- if include "eos-suite.samplerArgSet" . }}
{{- toString .Values.otel.samplerArg }}
{{- else }}
{{- toString .Values.telemetry.samplingRatio }}
{{- end }}
{{- end }}
{{- end }}

{{/* Whether otel.samplerArg is set: 0 is a ratio too (trace nothing), unlike "" or null. */}}
{{- define "eos-suite.samplerArgSet" -}}
{{- if and (hasKey .Values.otel "samplerArg") (not (kindIs "invalid" .Values.otel.samplerArg)) (ne (toString .Values.otel.samplerArg) "") }}true{{ end }}
{{- end }}

{{/* Whether a database URL carries a password (user:password@, or a password= parameter). */}}
{{- define "eos-suite.urlHasPassword" -}}
{{- if or (regexMatch "^[a-z]+://[^/@?#]*:[^/@?#]*@" .) (regexMatch "[?&]password=" .) }}true{{ end }}
{{- end }}

{{/*
The sink's and the processor's replicas against the partitions: a replica beyond the partition
count holds no partition and is never ready, so a rolling update, `helm upgrade --wait` and a
drain wait for it forever.
*/}}
{{- define "eos-suite.validatePartitions" -}}
{{- $partitions := int .Values.partitions }}
{{- range $component := list (list "processor" $.Values.processor "the input topic") (list "sink" $.Values.sink "the sink's topic (the processor's output)") }}
{{- $values := index $component 1 }}
{{- if and $values.enabled (gt (int $values.replicas) $partitions) }}
{{- fail (printf "%s.replicas (%d) is more than partitions (%d), the partition count of %s: a replica without a partition is never ready, so rolling updates, helm upgrade --wait and node drains stall; lower %s.replicas or set partitions to the topic's partition count (deploy/helm/eos-suite/README.md \"Partitions and replicas\")" (index $component 0) (int $values.replicas) $partitions (index $component 2) (index $component 0)) }}
{{- end }}
{{- end }}
{{- end }}

{{/* Checks of the production settings: credentials, certificates, transform, sampler. */}}
{{- define "eos-suite.validateProduction" -}}
{{- range $role := list (list "database" $.Values.database) (list "migration" $.Values.migration) }}
{{- $values := index $role 1 }}
{{- if and $values.passwordSecret.name $values.url (include "eos-suite.urlHasPassword" $values.url) }}
{{- fail (printf "%s.url has a password and %s.passwordSecret names another: leave the password out of the URL (the service refuses both)" (index $role 0) (index $role 0)) }}
{{- end }}
{{- end }}
{{- if and .Values.database.tls.ca.existingSecret .Values.database.tls.ca.existingConfigMap }}
{{- fail "database.tls.ca: set existingSecret or existingConfigMap, not both" }}
{{- end }}
{{- $caFile := "/etc/eos-suite/postgres-ca/ca.crt" }}
{{- if or .Values.database.tls.ca.existingSecret .Values.database.tls.ca.existingConfigMap }}
{{- range $role := list (list "database" $.Values.database) (list "migration" $.Values.migration) }}
{{- $url := (index $role 1).url }}
{{- if and $url (not (contains (printf "sslrootcert=%s" $caFile) $url)) }}
{{- fail (printf "%s.url does not name the CA database.tls.ca mounts: add sslrootcert=%s (and sslmode=verify-full) to it" (index $role 0) $caFile) }}
{{- end }}
{{- end }}
{{- end }}
{{- $properties := .Values.kafka.clientProperties | default dict }}
{{- if and .Values.kafka.tls.ca.existingSecret (hasKey $properties "ssl.ca.location") }}
{{- fail "kafka.tls.ca sets ssl.ca.location: remove it from kafka.clientProperties" }}
{{- end }}
{{- if and .Values.kafka.tls.clientCert.existingSecret (or (hasKey $properties "ssl.certificate.location") (hasKey $properties "ssl.key.location")) }}
{{- fail "kafka.tls.clientCert sets ssl.certificate.location and ssl.key.location: remove them from kafka.clientProperties" }}
{{- end }}
{{- if .Values.processor.enabled }}
{{- $transform := .Values.processor.transform }}
{{- if hasPrefix "wasm:" $transform }}
{{- $module := trimPrefix "wasm:" $transform }}
{{- $mounted := and .Values.processor.wasm.configMap (hasPrefix "/etc/eos-suite/wasm/" $module) }}
{{- range .Values.processor.extraVolumeMounts }}
{{- if hasPrefix (printf "%s/" (trimSuffix "/" .mountPath)) $module }}
{{- $mounted = true }}
{{- end }}
{{- end }}
{{- if not $mounted }}
{{- fail (printf "processor.transform loads %s, which no volume mounts: set processor.wasm.configMap (mounted at /etc/eos-suite/wasm/) or mount it with processor.extraVolumes and processor.extraVolumeMounts" $module) }}
{{- end }}
{{- else if .Values.processor.wasm.configMap }}
{{- fail (printf "processor.wasm.configMap is set but processor.transform is %q: set it to wasm:/etc/eos-suite/wasm/<key of the module>" $transform) }}
{{- end }}
{{- end }}
{{- $samplerArg := .Values.otel.samplerArg }}
{{- if include "eos-suite.samplerArgSet" . }}
{{- if not (has .Values.otel.sampler (list "traceidratio" "parentbased_traceidratio")) }}
{{- fail (printf "otel.samplerArg is only read by the ratio samplers (traceidratio, parentbased_traceidratio), not %s" .Values.otel.sampler) }}
{{- end }}
{{- $ratio := ternary (float64 $samplerArg) -1.0 (regexMatch "^[0-9]*\\.?[0-9]+$" (toString $samplerArg)) }}
{{- if or (lt $ratio 0.0) (gt $ratio 1.0) }}
{{- fail (printf "otel.samplerArg (%v) must be a ratio from 0 to 1" $samplerArg) }}
{{- end }}
{{- end }}
{{- end }}

{{/*
One NetworkPolicy egress rule from networkPolicy.<destination>: its ports, to its peers (any
address when `to` is empty). Args: .Values.networkPolicy.<destination>.
*/}}
{{- define "eos-suite.egressRule" -}}
{{- $rule := dict "ports" .ports }}
{{- with .to }}
{{- $_ := set $rule "to" . }}
{{- end }}
{{- toYaml $rule }}
{{- end }}

{{/*
"true" when the processor's input or outputs (outputFormat, or an output's own format in
outputSchemas) are in a schema registry's format (then it needs schemaRegistry.url, its
credentials and egress to it), else "".
*/}}
{{- define "eos-suite.processorUsesRegistry" -}}
{{- if or (ne .Values.processor.inputFormat "json") (ne .Values.processor.outputFormat "json") (include "eos-suite.registryOutputSchemas" . | trim) -}}
true
{{- end -}}
{{- end }}

{{- /* The processor's outputSchemas in a registry format, as "processor.outputSchemas.NAME FORMAT"
lines (sorted by name), for the message of a render without schemaRegistry.url. */}}
{{- define "eos-suite.registryOutputSchemas" -}}
{{- range $name, $schema := .Values.processor.outputSchemas | default dict }}
{{- if ne $schema.format "json" }}
{{ printf "processor.outputSchemas.%s %s" $name $schema.format }}
{{- end }}
{{- end }}
{{- end }}

{{- /* What makes the processor need the registry, for the failure without schemaRegistry.url:
"processor.inputFormat X and processor.outputFormat Y", then each output schema in a registry
format ("processor.inputFormat X, processor.outputFormat Y and processor.outputSchemas.NAME F"). */}}
{{- define "eos-suite.processorRegistryReasons" -}}
{{- $reasons := list (printf "processor.inputFormat %s" .Values.processor.inputFormat) (printf "processor.outputFormat %s" .Values.processor.outputFormat) }}
{{- range splitList "\n" (include "eos-suite.registryOutputSchemas" . | trim) }}
{{- if . }}
{{- $reasons = append $reasons . }}
{{- end }}
{{- end }}
{{- printf "%s and %s" (join ", " (initial $reasons)) (last $reasons) }}
{{- end }}

{{- /* EOS_OUTPUT_SCHEMAS: NAME=FORMAT[@SUBJECT] of each processor.outputSchemas entry, sorted by
name (a template ranges over a map in key order), comma-separated. */}}
{{- define "eos-suite.outputSchemasList" -}}
{{- $entries := list }}
{{- range $name, $schema := . }}
{{- $entry := printf "%s=%s" $name $schema.format }}
{{- with $schema.subject }}
{{- $entry = printf "%s@%s" $entry . }}
{{- end }}
{{- $entries = append $entries $entry }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{- /* TARGET=VALUE,... of a map target name -> value, sorted by target (a template ranges over a
map in key order), so renders are stable: DEDUP_RECONCILE_STRATEGIES, DEDUP_KEY_TTLS. */}}
{{- define "eos-suite.targetList" -}}
{{- $entries := list }}
{{- range $target, $value := . }}
{{- $entries = append $entries (printf "%s=%s" $target (toString $value)) }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{- /* Secrets of yours mounted read-only as directories (sink.targetSecrets,
dedup.lookupSecrets): volume <prefix>-<index> each. Args: (list "prefix" <list of {name,
mountPath}>). */}}
{{- define "eos-suite.secretDirectoryMounts" -}}
{{- $prefix := index . 0 }}
{{- range $index, $secret := index . 1 }}
- name: {{ printf "%s-%d" $prefix $index }}
  mountPath: {{ $secret.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{- define "eos-suite.secretDirectoryVolumes" -}}
{{- $prefix := index . 0 }}
{{- range $index, $secret := index . 1 }}
- name: {{ printf "%s-%d" $prefix $index }}
  secret:
    secretName: {{ $secret.name }}
{{- end }}
{{- end }}

{{- /* Whether sink-writer reads its topic in a schema registry's format. */}}
{{- define "eos-suite.sinkUsesRegistry" -}}
{{- if ne .Values.sink.inputFormat "json" -}}
true
{{- end -}}
{{- end }}

{{- /* Whether outbox-relay writes its values in a schema registry's format
(outboxRelay.valueFormat). */}}
{{- define "eos-suite.relayUsesRegistry" -}}
{{- if ne .Values.outboxRelay.valueFormat "json" -}}
true
{{- end -}}
{{- end }}

{{- /* OUTBOX_VALUE_SUBJECTS: TOPIC=SUBJECT[@VERSION] of each outboxRelay.valueSubjects entry,
sorted by topic (a template ranges over a map in key order), comma-separated. */}}
{{- define "eos-suite.valueSubjectsList" -}}
{{- $entries := list }}
{{- range $topic, $named := . }}
{{- $entry := printf "%s=%s" $topic $named.subject }}
{{- with $named.version }}
{{- /* A number from YAML is a float64 here: printed whole. */}}
{{- $entry = printf "%s@%d" $entry (int64 .) }}
{{- end }}
{{- $entries = append $entries $entry }}
{{- end }}
{{- join "," $entries }}
{{- end }}

{{- /* The schema registry's env for a component with a registry format: (list root what), what
naming the values that need it in the failure without schemaRegistry.url. */}}
{{- define "eos-suite.schemaRegistryEnv" -}}
{{- $root := index . 0 -}}
{{- if not $root.Values.schemaRegistry.url }}
{{- fail (printf "%s: a registry format needs schemaRegistry.url (docs/schemas.md)" (index . 1)) }}
{{- end }}
- name: EOS_SCHEMA_REGISTRY_URL
  value: {{ $root.Values.schemaRegistry.url | quote }}
{{- if $root.Values.schemaRegistry.authSecret }}
- name: EOS_SCHEMA_REGISTRY_AUTH_FILE
  value: /etc/eos-suite/schema-registry/auth
{{- end }}
{{- end }}

{{- /* The registry's credentials file, mounted where EOS_SCHEMA_REGISTRY_AUTH_FILE points. */}}
{{- define "eos-suite.schemaRegistryVolumeMount" -}}
{{- if .Values.schemaRegistry.authSecret }}
- name: schema-registry-auth
  mountPath: /etc/eos-suite/schema-registry
  readOnly: true
{{- end }}
{{- end }}

{{- /* USER:PASSWORD for the schema registry, as a file: never in the environment. */}}
{{- define "eos-suite.schemaRegistryVolume" -}}
{{- if .Values.schemaRegistry.authSecret }}
- name: schema-registry-auth
  secret:
    secretName: {{ .Values.schemaRegistry.authSecret }}
    items:
      - key: auth
        path: auth
{{- end }}
{{- end }}
