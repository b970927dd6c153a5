#!/usr/bin/env bash
# Writes manifests/{rbac,config,daemonset}.yaml from the Helm chart charts/nftproxy with
# the values charts/nftproxy/ci/manifests-values.yaml: the chart is the one source, and
# manifests_test.go fails when the files differ from what this writes.
# Usage: manifests/generate.sh [output directory, default manifests/]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$root/manifests}"
helm="${HELM:-$root/bin/helm}"
[ -x "$helm" ] || { echo "$helm not found: run e2e/hack/install-tools.sh (or make deps)" >&2; exit 1; }
gen() { # file template
  {
    echo "# Generated from the Helm chart charts/nftproxy by \`make manifests\` (manifests/generate.sh)"
    echo "# with charts/nftproxy/ci/manifests-values.yaml. Do not edit: change the chart."
    [ -n "${3:-}" ] && printf '%s\n' "$3"
    "$helm" template nftproxy "$root/charts/nftproxy" --namespace kube-system \
      -f "$root/charts/nftproxy/ci/manifests-values.yaml" --show-only "templates/$2"
  } > "$out/$1.tmp"
  mv "$out/$1.tmp" "$out/$1"
}
gen rbac.yaml rbac.yaml
gen config.yaml config.yaml "#
# EDIT ONE LINE before applying: in the kubeconfig below, replace the placeholder host
# of \`server:\` by your API server's address as the nodes reach it (kubeadm: its
# controlPlaneEndpoint; kind: <cluster>-control-plane). Or install with Helm:
# --set apiServer.host=... --set apiServer.port=... (docs/operations.md)."
gen daemonset.yaml daemonset.yaml
