{{/* The name of kpr's objects, and the prefix of the others'. */}}
{{- define "kpr.fullname" -}}
{{- .Values.fullnameOverride | default "kpr" | trunc 50 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object: the base's (deploy/base/kustomization.yaml), and Helm's. */}}
{{- define "kpr.labels" -}}
app.kubernetes.io/name: kpr
app.kubernetes.io/part-of: kpr
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/version: {{ include "kpr.tag" . | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "kpr.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{/* The kpr image, pinned by version, and its pull policy. */}}
{{- define "kpr.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (include "kpr.tag" .) | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The port of config.healthzBindAddress, where the probes ask. */}}
{{- define "kpr.healthzPort" -}}
{{- .Values.config.healthzBindAddress | default "0.0.0.0:10256" | splitList ":" | last -}}
{{- end -}}

{{/* Scheduling shared by kpr and its cleanup: every node kpr runs on. */}}
{{- define "kpr.scheduling" -}}
hostNetwork: true
priorityClassName: system-node-critical
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
