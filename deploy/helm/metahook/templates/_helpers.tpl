{{/* Chart name, or nameOverride; 63 characters at most (DNS label). */}}
{{- define "metahook.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
Fully qualified app name: fullnameOverride, else "<release>-<name>", or just the release name when it
already contains the chart name (release "metahook" gives "metahook").
*/}}
{{- define "metahook.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Namespace of the namespaced objects. */}}
{{- define "metahook.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{/* "name-version" for the helm.sh/chart label. */}}
{{- define "metahook.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object. */}}
{{- define "metahook.labels" -}}
helm.sh/chart: {{ include "metahook.chart" . }}
{{ include "metahook.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: metahook
{{- end }}

{{/* Labels selecting the hub's Pods. */}}
{{- define "metahook.selectorLabels" -}}
app.kubernetes.io/name: {{ include "metahook.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* Labels selecting the hub's Pods (not the Service's, which are the component "metrics"). */}}
{{- define "metahook.hubSelectorLabels" -}}
{{ include "metahook.selectorLabels" . }}
app.kubernetes.io/component: hub
{{- end }}

{{/* ServiceAccount the hub runs as. */}}
{{- define "metahook.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "metahook.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The hub's config file (metahook.yaml) as rendered into the ConfigMap. */}}
{{- define "metahook.configFile" -}}
{{- $config := deepCopy (.Values.config | default dict) }}
{{- if .Values.metrics.tls.secretName }}
{{- $_ := set $config "metricsCertDir" (include "metahook.metricsCertDir" .) }}
{{- end }}
{{- $files := list }}
{{- if (.Values.controllersFrom | default dict).configMap }}
{{- $files = append $files "/etc/metahook-controllers/configmap" }}
{{- end }}
{{- if .Values.controllers }}
{{- $files = append $files "/etc/metahook-controllers/chart" }}
{{- end }}
{{- if $files }}
{{- $_ := set $config "controllersFrom" (concat ($config.controllersFrom | default list) $files) }}
{{- end }}
{{- if $config }}
{{- toYaml $config }}
{{- else -}}
{}
{{- end }}
{{- end }}

{{/* Where metrics.tls.secretName is mounted (config.metricsCertDir). */}}
{{- define "metahook.metricsCertDir" -}}
/etc/metahook-metrics-tls
{{- end }}
