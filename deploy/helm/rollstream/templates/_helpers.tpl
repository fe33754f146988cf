{{/* The name of one component's objects: <release>-<component>. */}}
{{- define "rollstream.name" -}}
{{- printf "%s-%s" .root.Release.Name .name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "rollstream.labels" -}}
app.kubernetes.io/name: rollstream
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{- define "rollstream.selector" -}}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .name }}
{{- end -}}

{{/* The Rollstream image: the tag defaults to the chart's appVersion (what `make image` tags). */}}
{{- define "rollstream.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The endpoints RUN and the controller use: listed URLs, this chart's vLLM, or the embedded
server. */}}
{{- define "rollstream.policyUrls" -}}
{{- $urls := list -}}
{{- with .Values.inference.urls }}{{ $urls = append $urls . }}{{ end -}}
{{- if .Values.inference.vllm.enabled -}}
{{- range $i := until (int .Values.inference.vllm.replicas) -}}
{{- $urls = append $urls (printf "http://%s-vllm-%d:8000" $.Release.Name $i) -}}
{{- end -}}
{{- end -}}
{{- if .Values.inference.embedded -}}
{{- $urls = append $urls (printf "http://%s-policy:8011" .Release.Name) -}}
{{- end -}}
{{- if not $urls -}}
{{- fail "no inference servers: set inference.urls, inference.vllm.enabled or inference.embedded" -}}
{{- end -}}
{{- join "," $urls -}}
{{- end -}}

{{/* Whether the loop trains and serves the Hugging Face model at model.path: vLLM cannot load
the embedded policy's weights, so with vLLM from this chart it always does. */}}
{{- define "rollstream.hf" -}}
{{- if or .Values.trainer.hf .Values.inference.vllm.enabled }}true{{ end -}}
{{- end -}}

{{- define "rollstream.checkpointsClaim" -}}
{{- .Values.checkpoints.existingClaim | default (printf "%s-checkpoints" .Release.Name) -}}
{{- end -}}

{{/* The Kafka credentials every process and KEDA's Kafka scaler use, from
kafka.authentication, as a dict: mechanism, protocol, username (a value) or usernameSecret,
passwordSecret, passwordKey, caSecret, caKey (empty: no CA file). Empty for none. */}}
{{- define "rollstream.kafkaAuth" -}}
{{- $k := .Values.kafka -}}
{{- if and $k.existingSecret (ne $k.authentication "none") -}}
{{- fail (printf "kafka.existingSecret is a complete client.properties: set kafka.authentication to none, not %q" $k.authentication) -}}
{{- end -}}
{{- if eq $k.authentication "strimzi" -}}
{{- if not (and $k.strimzi.enabled $k.strimzi.user.enabled) -}}
{{- fail "kafka.authentication strimzi needs the chart's KafkaUser (kafka.strimzi.enabled and kafka.strimzi.user.enabled); without Strimzi use credentials or none" -}}
{{- end -}}
{{- if ne $k.strimzi.user.authentication "scram-sha-512" -}}
{{- fail (printf "kafka.authentication strimzi wires SCRAM-SHA-512 users, not %q: set kafka.strimzi.user.authentication to scram-sha-512" $k.strimzi.user.authentication) -}}
{{- end -}}
{{- toJson (dict "mechanism" "SCRAM-SHA-512" "protocol" "SASL_SSL" "username" .Release.Name
      "passwordSecret" .Release.Name "passwordKey" "password"
      "caSecret" (printf "%s-cluster-ca-cert" $k.strimzi.cluster) "caKey" "ca.crt") -}}
{{- else if eq $k.authentication "credentials" -}}
{{- $c := $k.credentials -}}
{{- if not $c.secretName -}}
{{- fail "kafka.authentication credentials needs kafka.credentials.secretName (a Secret with the SASL username and password)" -}}
{{- end -}}
{{- if not (has $c.mechanism (list "SCRAM-SHA-512" "SCRAM-SHA-256" "PLAIN")) -}}
{{- fail (printf "kafka.credentials.mechanism must be SCRAM-SHA-512, SCRAM-SHA-256 or PLAIN, not %q" $c.mechanism) -}}
{{- end -}}
{{- toJson (dict "mechanism" $c.mechanism "protocol" (ternary "SASL_SSL" "SASL_PLAINTEXT" $c.tls)
      "usernameSecret" $c.secretName "usernameKey" $c.usernameKey
      "passwordSecret" $c.secretName "passwordKey" $c.passwordKey
      "caSecret" $c.caSecretName "caKey" $c.caKey) -}}
{{- else if eq $k.authentication "none" -}}
{{- toJson dict -}}
{{- else -}}
{{- fail (printf "kafka.authentication must be strimzi, credentials or none, not %q" $k.authentication) -}}
{{- end -}}
{{- end -}}

{{/* Init containers of a pod whose processes talk to Kafka: with credentials, one writes
/etc/rollstream/kafka/client.properties from kafka.clientProperties, the SASL user and password
(from their Secrets, as environment variables of this container only) and the CA's path. */}}
{{- define "rollstream.kafkaInit" -}}
{{- $auth := include "rollstream.kafkaAuth" . | fromJson -}}
{{- if $auth }}
- name: kafka-config
  image: {{ include "rollstream.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: ["python", "/etc/rollstream/kafka-script/client_properties.py",
            "/etc/rollstream/kafka-base/client.properties", "/etc/rollstream/kafka/client.properties"]
  env:
    - {name: KAFKA_SECURITY_PROTOCOL, value: {{ $auth.protocol }}}
    - {name: KAFKA_SASL_MECHANISM, value: {{ $auth.mechanism }}}
    {{- if $auth.username }}
    - {name: KAFKA_SASL_USERNAME, value: {{ $auth.username | quote }}}
    {{- else }}
    - name: KAFKA_SASL_USERNAME
      valueFrom: {secretKeyRef: {name: {{ $auth.usernameSecret }}, key: {{ $auth.usernameKey }}}}
    {{- end }}
    - name: KAFKA_SASL_PASSWORD
      valueFrom: {secretKeyRef: {name: {{ $auth.passwordSecret }}, key: {{ $auth.passwordKey }}}}
    {{- if $auth.caSecret }}
    - {name: KAFKA_SSL_CA_LOCATION, value: /etc/rollstream/kafka-ca/ca.crt}
    {{- end }}
  volumeMounts:
    - {name: kafka-base, mountPath: /etc/rollstream/kafka-base, readOnly: true}
    - {name: kafka-script, mountPath: /etc/rollstream/kafka-script, readOnly: true}
    - {name: kafka-config, mountPath: /etc/rollstream/kafka}
{{- end }}
{{- end -}}

{{/* The Kafka volumes of such a pod: the client properties (the rendered Secret, or the file
the init container writes), the CA, the script. */}}
{{- define "rollstream.kafkaVolumes" -}}
{{- $auth := include "rollstream.kafkaAuth" . | fromJson -}}
{{- $secret := .Values.kafka.existingSecret | default (printf "%s-kafka" .Release.Name) -}}
{{- if $auth }}
- {name: kafka-base, secret: {secretName: {{ $secret }}}}
- {name: kafka-script, configMap: {name: {{ .Release.Name }}-kafka-script}}
- {name: kafka-config, emptyDir: {medium: Memory}}
{{- if $auth.caSecret }}
- name: kafka-ca
  secret:
    secretName: {{ $auth.caSecret }}
    items: [{key: {{ $auth.caKey }}, path: ca.crt}]
{{- end }}
{{- else }}
- {name: kafka-config, secret: {secretName: {{ $secret }}}}
{{- end }}
{{- end -}}

{{/* The container spec every Rollstream process shares: image, settings, Kafka client
properties, probes on the metrics port. Call with dict "root" $ "name" NAME "args" LIST
"resources" MAP, optionally "env" MAP, "mounts" LIST, "securityContext" MAP. */}}
{{- define "rollstream.container" -}}
{{- $auth := include "rollstream.kafkaAuth" .root | fromJson -}}
- name: {{ .name }}
  image: {{ include "rollstream.image" .root | quote }}
  imagePullPolicy: {{ .root.Values.image.pullPolicy }}
  args: {{ toJson .args }}
  envFrom:
    - configMapRef:
        name: {{ .root.Release.Name }}-settings
  env:
    - name: POD_NAME
      valueFrom:
        fieldRef:
          fieldPath: metadata.name
    {{- range $k, $v := .env }}
    - name: ROLLSTREAM_{{ upper $k }}
      value: {{ $v | quote }}
    {{- end }}
  ports:
    - name: metrics
      containerPort: {{ .root.Values.metricsPort }}
  livenessProbe:
    httpGet: {path: /health, port: metrics}
    periodSeconds: 10
    failureThreshold: 6
  readinessProbe:
    httpGet: {path: /ready, port: metrics}
    periodSeconds: 5
    failureThreshold: 3
  startupProbe:
    httpGet: {path: /health, port: metrics}
    periodSeconds: 2
    failureThreshold: 60
  resources: {{ toJson .resources }}
  {{- with .securityContext }}
  securityContext: {{ toJson . }}
  {{- end }}
  volumeMounts:
    - name: kafka-config
      mountPath: /etc/rollstream/kafka
      readOnly: true
    {{- if $auth.caSecret }}
    - {name: kafka-ca, mountPath: /etc/rollstream/kafka-ca, readOnly: true}
    {{- end }}
    {{- with .mounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
    {{- with .root.Values.extraVolumeMounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{/* extraVolumes: the volumes every Rollstream pod adds (values.yaml). */}}
{{- define "rollstream.extraVolumes" -}}
{{- with .Values.extraVolumes }}
{{- toYaml . }}
{{- end }}
{{- end -}}

{{/* The checkpoints volume mount: read-write for the trainer, read-only for the rest. */}}
{{- define "rollstream.checkpointsMount" -}}
{{- toJson (dict "name" "checkpoints" "mountPath" .root.Values.checkpoints.mountPath "readOnly" (not .write)) -}}
{{- end -}}

{{- define "rollstream.checkpointsVolume" -}}
- name: checkpoints
  persistentVolumeClaim:
    claimName: {{ include "rollstream.checkpointsClaim" . }}
{{- end -}}

{{/* Whether there is a checkpoints volume: the chart's (with the trainer) or one made elsewhere. */}}
{{- define "rollstream.hasCheckpoints" -}}
{{- if or .Values.trainer.enabled .Values.checkpoints.existingClaim }}true{{ end -}}
{{- end -}}

{{/* An init container that waits until the model download (templates/checkpoints.yaml) has
put model.path in place (it writes .downloaded last; a model copied there by hand needs that
file too): `image` is any image with a shell. */}}
{{- define "rollstream.waitForModel" -}}
- name: wait-for-model
  image: {{ .image | quote }}
  command: ["sh", "-c", "until [ -f {{ .root.Values.model.path }}/.downloaded ]; do echo waiting for {{ .root.Values.model.path }}; sleep 10; done"]
  volumeMounts:
    - {{ include "rollstream.checkpointsMount" (dict "root" .root "write" false) }}
{{- end -}}
