// Package manifests holds nftproxy's Kubernetes manifests (DaemonSet, ConfigMap with
// its KubeProxyConfiguration, ServiceAccount and RBAC) next to the repository's
// Containerfile; its tests check both offline.
package manifests
