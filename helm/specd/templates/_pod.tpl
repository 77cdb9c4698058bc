{{/* Pod pieces shared by the three services. Each takes (dict "root" $ "component" NAME ...). */}}

{{- define "specd.podSpecCommon" -}}
{{- $root := .root }}
{{- $values := index $root.Values .component -}}
serviceAccountName: {{ include "specd.serviceAccountName" $root }}
# The service drains for drainSeconds after SIGTERM (SPECD_DRAIN_SECONDS), then needs a moment to close down.
terminationGracePeriodSeconds: {{ add $values.drainSeconds 10 }}
automountServiceAccountToken: false
securityContext:
  {{- toYaml $root.Values.podSecurityContext | nindent 2 }}
{{- with $root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* Native gRPC probes; with TLS an exec probe, because the kubelet's gRPC probe cannot speak TLS. */}}
{{- define "specd.probes" -}}
{{- $root := .root }}
{{- $values := index $root.Values .component }}
{{- range $kind := list "startupProbe" "readinessProbe" "livenessProbe" }}
{{ $kind | trim }}:
  {{- if $root.Values.tls.enabled }}
  exec:
    command: [python, /etc/specd/probe/grpc_health_probe.py, --port, {{ $.port | quote }}, --server-name, {{ $.serverName | quote }}]
  timeoutSeconds: 5
  {{- else }}
  grpc:
    port: {{ $.port }}
  timeoutSeconds: 2
  {{- end }}
  {{- toYaml (index $values $kind) | nindent 2 }}
{{- end }}
{{- end }}

{{/* Variables every container gets: where to listen, where to write, and the TLS files. */}}
{{- define "specd.commonEnv" -}}
- name: SPECD_HOST
  value: 0.0.0.0
- name: HOME
  value: /tmp
{{- if .Values.tls.enabled }}
- name: SPECD_TLS_CERT
  value: /etc/specd/tls/tls.crt
- name: SPECD_TLS_KEY
  value: /etc/specd/tls/tls.key
- name: SPECD_TLS_CA
  value: /etc/specd/tls/ca.crt
{{- end }}
{{- end }}

{{/* The root filesystem is read-only: /tmp and SPECD_HOME (the converted default model) are emptyDirs. */}}
{{- define "specd.commonVolumes" -}}
- name: tmp
  emptyDir: {}
{{- if .Values.tls.enabled }}
- name: tls
  secret:
    secretName: {{ required "tls.secretName is required when tls.enabled" .Values.tls.secretName }}
    defaultMode: 0440
- name: probe
  configMap:
    name: {{ include "specd.fullname" . }}-probe
{{- end }}
{{- end }}

{{- define "specd.commonMounts" -}}
- name: tmp
  mountPath: /tmp
{{- if .Values.tls.enabled }}
- name: tls
  mountPath: /etc/specd/tls
  readOnly: true
- name: probe
  mountPath: /etc/specd/probe
  readOnly: true
{{- end }}
{{- end }}

{{/* The model, for the gateway (tokenizer, chat template) and the verifier (weights). */}}
{{- define "specd.modelVolumes" -}}
- name: specd-home
  emptyDir: {}
{{- $volume := .Values.model.volume }}
{{- if eq $volume.type "pvc" }}
- name: model
  persistentVolumeClaim:
    claimName: {{ required "model.volume.claimName is required when model.volume.type is pvc" $volume.claimName }}
    readOnly: true
{{- else if eq $volume.type "hostPath" }}
- name: model
  hostPath:
    path: {{ required "model.volume.hostPath is required when model.volume.type is hostPath" $volume.hostPath }}
    type: Directory
{{- end }}
{{- end }}

{{- define "specd.modelMounts" -}}
- name: specd-home
  mountPath: /var/lib/specd
{{- $volume := .Values.model.volume }}
{{- if ne $volume.type "none" }}
- name: model
  mountPath: {{ $volume.mountPath }}
  {{- with $volume.subPath }}
  subPath: {{ . }}
  {{- end }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Converts the default model once per pod before the service starts, so startup stays predictable. */}}
{{- define "specd.prepareModelInit" -}}
{{- $root := .root }}
{{- if eq $root.Values.model.name "default" -}}
initContainers:
  - name: prepare-model
    image: {{ include "specd.image" . }}
    imagePullPolicy: {{ $root.Values.image.pullPolicy }}
    command: [python, -m, specd.default_model]
    env:
      - name: SPECD_HOME
        value: /var/lib/specd
      - name: HOME
        value: /tmp
    securityContext:
      {{- toYaml $root.Values.securityContext | nindent 6 }}
    resources:
      {{- toYaml (index $root.Values .component).resources | nindent 6 }}
    volumeMounts:
      {{- include "specd.commonMounts" $root | nindent 6 }}
      {{- include "specd.modelMounts" $root | nindent 6 }}
{{- end }}
{{- end }}
