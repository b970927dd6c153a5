{{/* The name of every object: the release name (one nftproxy per cluster). */}}
{{- define "nftproxy.name" -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "nftproxy.labels" -}}
app.kubernetes.io/name: nftproxy
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ include "nftproxy.tag" . | quote }}
app.kubernetes.io/component: service-proxy
{{- end -}}

{{/* The DaemonSet's selector: immutable, so it never depends on optional values. */}}
{{- define "nftproxy.selector" -}}
app.kubernetes.io/name: nftproxy
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The pods' k8s-app label: nftproxy, or kube-proxy with kubeProxyLabel so that
kube-prometheus-stack's kube-proxy Service (selector k8s-app: kube-proxy) finds them.
*/}}
{{- define "nftproxy.k8sApp" -}}
{{- if .Values.kubeProxyLabel -}}kube-proxy{{- else -}}nftproxy{{- end -}}
{{- end -}}

{{- define "nftproxy.tag" -}}
{{- .Values.image.tag | default .Chart.AppVersion -}}
{{- end -}}

{{- define "nftproxy.image" -}}
{{- if eq (include "nftproxy.tag" .) "dev" -}}
{{- fail "image.tag dev is a local build's tag, not a release: set image.tag to a release (the default is the chart's appVersion)" -}}
{{- end -}}
{{- printf "%s:%s" .Values.image.repository (include "nftproxy.tag" .) -}}
{{- end -}}

{{/* The API server's URL, from the required apiServer.host and apiServer.port. */}}
{{- define "nftproxy.apiServerURL" -}}
{{- $host := required "apiServer.host is required: the API server's address as the nodes reach it (not the kubernetes Service's cluster IP, which needs a running service proxy), e.g. --set apiServer.host=10.0.0.10" .Values.apiServer.host -}}
{{- $port := required "apiServer.port is required: the API server's port as the nodes reach it, e.g. --set apiServer.port=6443" .Values.apiServer.port -}}
{{- if and (contains ":" $host) (not (hasPrefix "[" $host)) -}}
{{- $host = printf "[%s]" $host -}}
{{- end -}}
{{- printf "https://%s:%v" $host $port -}}
{{- end -}}

{{/* The port of an address host:port. */}}
{{- define "nftproxy.port" -}}
{{- regexFind "[0-9]+$" . -}}
{{- end -}}
