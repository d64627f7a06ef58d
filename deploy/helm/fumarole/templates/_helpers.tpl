{{/* Labels shared by every object of one component: include "fumarole.labels" (list . "name") */}}
{{- define "fumarole.labels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ index . 1 }}
app.kubernetes.io/part-of: fumarole
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/managed-by: {{ $root.Release.Service }}
helm.sh/chart: {{ $root.Chart.Name }}-{{ $root.Chart.Version }}
{{- end -}}

{{- define "fumarole.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The agent's ServiceAccount as the API server names its user. */}}
{{- define "fumarole.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:fumarole-agent
{{- end -}}
