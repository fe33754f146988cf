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

{{/* The container spec every Rollstream process shares: image, settings, Kafka client
properties, probes on the metrics port. Call with dict "root" $ "name" NAME "args" LIST
"resources" MAP. */}}
{{- define "rollstream.container" -}}
- name: {{ .name }}
  image: "{{ .root.Values.image.repository }}:{{ .root.Values.image.tag }}"
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
    {{- with .mounts }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
{{- end -}}

{{- define "rollstream.kafkaVolume" -}}
- name: kafka-config
  secret:
    secretName: {{ .Values.kafka.existingSecret | default (printf "%s-kafka" .Release.Name) }}
{{- end -}}
