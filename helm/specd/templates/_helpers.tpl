{{/* Names and labels shared by every object of the release. */}}

{{- define "specd.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Leaves room for the longest suffix ("-verifier-headless") within the 63-character DNS label. */}}
{{- define "specd.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" }}
{{- else if contains (include "specd.name" .) .Release.Name }}
{{- .Release.Name | trunc 45 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "specd.name" .) | trunc 45 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "specd.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/part-of: specd
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{ include "specd.selectorLabels" . }}
{{- end }}

{{/* Pass (dict "root" $ "component" "gateway") for a component's labels. */}}
{{- define "specd.componentLabels" -}}
{{ include "specd.labels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "specd.selectorLabels" -}}
app.kubernetes.io/name: {{ include "specd.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "specd.componentSelectorLabels" -}}
{{ include "specd.selectorLabels" .root }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "specd.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "specd.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image of one component: (dict "root" $ "component" "verifier"). */}}
{{- define "specd.image" -}}
{{- $values := index .root.Values .component }}
{{- $repository := $values.image.repository }}
{{- with .root.Values.image.registry }}
{{- $repository = printf "%s/%s" (trimSuffix "/" .) $repository }}
{{- end }}
{{- printf "%s:%s" $repository (default .root.Chart.AppVersion .root.Values.image.tag) }}
{{- end }}

{{- define "specd.gatewayHost" -}}
{{ include "specd.fullname" . }}-gateway
{{- end }}

{{- define "specd.drafterAddr" -}}
{{ include "specd.fullname" . }}-drafter:50071
{{- end }}

{{- define "specd.verifierHeadless" -}}
{{ include "specd.fullname" . }}-verifier-headless
{{- end }}

{{/* One address per verifier pod, each its own --verifier-addr, so the gateway routes by replica load. */}}
{{- define "specd.verifierAddrs" -}}
{{- if .Values.gateway.verifierAddrs }}
{{- toYaml .Values.gateway.verifierAddrs }}
{{- else }}
{{- $fullname := include "specd.fullname" . }}
{{- range $index := until (int .Values.verifier.replicaCount) }}
- {{ printf "%s-verifier-%d.%s-verifier-headless.%s.svc:50061" $fullname $index $fullname $.Release.Namespace }}
{{- end }}
{{- end }}
{{- end }}

{{- define "specd.apiKeySecretName" -}}
{{- default (printf "%s-api-key" (include "specd.fullname" .)) .Values.apiKey.existingSecret }}
{{- end }}

{{- define "specd.apiKeyEnabled" -}}
{{- if or .Values.apiKey.existingSecret .Values.apiKey.value }}true{{ end }}
{{- end }}

{{/* Gateway processes per pod: gateway.processes, else one per CPU of the gateway's CPU request, rounded up
("500m" -> 1, "1500m" -> 2, 4 -> 4), else 1. */}}
{{- define "specd.gatewayProcesses" -}}
{{- if .Values.gateway.processes -}}
{{- .Values.gateway.processes -}}
{{- else -}}
{{- $cpu := toString (dig "requests" "cpu" "1" .Values.gateway.resources) -}}
{{- if hasSuffix "m" $cpu -}}
{{- max 1 (div (add (trimSuffix "m" $cpu | atoi) 999) 1000) -}}
{{- else -}}
{{- max 1 (ceil (float64 $cpu) | int) -}}
{{- end -}}
{{- end -}}
{{- end -}}
