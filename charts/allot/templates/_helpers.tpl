{{/*
Names are fixed (allot-agent, allot-controller, allot-webhook, …): allot is one per cluster (its
CRDs, webhook configurations and Policy are cluster-scoped), and the controller's own defaults
use these names.
*/}}

{{- define "allot.labels" -}}
app.kubernetes.io/name: allot
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{- define "allot.selector" -}}
app.kubernetes.io/name: allot
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "allot.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{/* The agent's unix socket on the node. */}}
{{- define "allot.socket" -}}
{{ trimSuffix "/" .Values.agent.socketDir }}/agent.sock
{{- end }}

{{/*
The ipam section every network using allot carries: the agent's socket and journal as this
chart runs the agent, and network.ipam's fields.
*/}}
{{- define "allot.ipam" -}}
{{- $ipam := dict "type" "allot" "socket" (include "allot.socket" .) "journal" .Values.agent.journalDir -}}
{{- toJson (merge (deepCopy .Values.network.ipam) $ipam) -}}
{{- end }}

{{/* The network configuration list: the main plugin with allot's ipam, then chained plugins. */}}
{{- define "allot.conflist" -}}
{{- $main := merge (dict "type" .Values.network.type "ipam" (include "allot.ipam" . | fromJson)) (deepCopy .Values.network.config) -}}
{{- $plugins := prepend .Values.network.chained $main -}}
{{- toPrettyJson (dict "cniVersion" .Values.network.cniVersion "name" .Values.network.name "plugins" $plugins) -}}
{{- end }}

{{/* The names of the CRDs in crds/ (PLURAL.allot.dev), for the CRD hook's RBAC. */}}
{{- define "allot.crdNames" -}}
{{- $names := list -}}
{{- range $path, $_ := .Files.Glob "crds/*.yaml" -}}
{{- $names = append $names (base $path | trimSuffix ".yaml") -}}
{{- end -}}
{{- toJson $names -}}
{{- end }}

{{/* A list value given as one string (--set ipv4.ips=a-b) or a list. */}}
{{- define "allot.list" -}}
{{- if kindIs "string" . -}}
{{- if . }}{{ list . | toJson }}{{ else }}[]{{ end -}}
{{- else -}}
{{- toJson (. | default list) -}}
{{- end -}}
{{- end }}

{{- define "allot.securityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
Where the hook Jobs run. They reach the API server and nothing else, so they use the node's
network: on a cluster whose only pod network is allot's own conflist, no pod network exists
before the agents install it (a first install) nor after uninstall removed it. They may land on
a node whose network is not ready yet, which such a node's taints say.
*/}}
{{- define "allot.hookNetwork" -}}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
tolerations:
  - key: node.kubernetes.io/not-ready
    operator: Exists
    effect: NoSchedule
  - key: node.kubernetes.io/network-unavailable
    operator: Exists
    effect: NoSchedule
  {{- with .Values.controller.tolerations }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}
