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

{{/* The kpr image, pinned by version or, when image.digest is set, by
digest, and its pull policy. */}}
{{- define "kpr.image" -}}
{{- $image := printf "%s:%s" .Values.image.repository (include "kpr.tag" .) -}}
{{- with .Values.image.digest }}{{ $image = printf "%s@%s" $.Values.image.repository . }}{{ end -}}
image: {{ $image | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end -}}

{{/* The port of config.healthzBindAddress, where the probes ask. */}}
{{- define "kpr.healthzPort" -}}
{{- .Values.config.healthzBindAddress | default "0.0.0.0:10256" | splitList ":" | last -}}
{{- end -}}

{{/* The port of config.metricsBindAddress, which the PodMonitor scrapes. */}}
{{- define "kpr.metricsPort" -}}
{{- .Values.config.metricsBindAddress | default "127.0.0.1:10249" | splitList ":" | last -}}
{{- end -}}

{{/* Whether config.metricsBindAddress is a loopback address, which no
Prometheus outside the node reaches. */}}
{{- define "kpr.metricsOnLoopback" -}}
{{- $host := .Values.config.metricsBindAddress | default "127.0.0.1:10249" | trimSuffix (printf ":%s" (include "kpr.metricsPort" .)) | trimPrefix "[" | trimSuffix "]" -}}
{{- if or (hasPrefix "127." $host) (eq $host "::1") (eq $host "localhost") }}true{{ end -}}
{{- end -}}

{{/* Whether the cluster takes securityContext.appArmorProfile (1.30+);
older ones take the container.apparmor.security.beta.kubernetes.io
annotations, as Cilium's chart does. */}}
{{- define "kpr.appArmorField" -}}
{{- if semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version }}true{{ end -}}
{{- end -}}

{{/* The Pod template's metadata: the selector's label, the chart's
labels, podLabels and podAnnotations; before 1.30 the AppArmor
annotation of each container in the list given as "containers". */}}
{{- define "kpr.podMetadata" -}}
{{- $root := .root -}}
labels:
  k8s-app: {{ .app }}
  {{- include "kpr.labels" $root | nindent 2 }}
  {{- with $root.Values.podLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- $annotations := deepCopy ($root.Values.podAnnotations | default dict) -}}
{{- with .annotations }}
{{- $annotations = merge $annotations . -}}
{{- end }}
{{- with $root.Values.appArmorProfile }}
{{- if not (include "kpr.appArmorField" $root) }}
{{- $value := .type | lower }}
{{- if eq .type "RuntimeDefault" }}{{ $value = "runtime/default" }}{{ end }}
{{- if eq .type "Localhost" }}{{ $value = printf "localhost/%s" .localhostProfile }}{{ end }}
{{- range $.containers }}
{{- $_ := set $annotations (printf "container.apparmor.security.beta.kubernetes.io/%s" .) $value }}
{{- end }}
{{- end }}
{{- end }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The DaemonSet's own metadata.labels and annotations. */}}
{{- define "kpr.daemonSetMetadata" -}}
labels:
  k8s-app: {{ .app }}
  {{- include "kpr.labels" .root | nindent 2 }}
  {{- with .root.Values.daemonSetLabels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .root.Values.daemonSetAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Scheduling and Pod-wide settings shared by kpr and its cleanup:
every node kpr runs on. */}}
{{- define "kpr.podSpec" -}}
hostNetwork: true
# The node's own resolver: kpr's lookups must not depend on the cluster
# DNS, whose Service only kpr makes reachable.
dnsPolicy: Default
priorityClassName: system-node-critical
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .Values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if and .Values.appArmorProfile (include "kpr.appArmorField" .) }}
securityContext:
  appArmorProfile:
    {{- toYaml .Values.appArmorProfile | nindent 4 }}
{{- end }}
{{- end -}}

{{/* The container-level SELinux label (values.yaml's seLinuxOptions). */}}
{{- define "kpr.seLinux" -}}
{{- with .Values.seLinuxOptions -}}
seLinuxOptions:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}
