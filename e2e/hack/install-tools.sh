#!/usr/bin/env bash
# Builds the chart and monitoring tools from the Go module proxy into bin/ (no prebuilt
# downloads): helm (helm lint, helm template, the real-cluster e2e's helm install) and
# promtool (promtool check rules, promtool test rules). Each is rebuilt only when its
# pinned version changes. Prints nothing on success.
set -euo pipefail
HELM_VERSION=v3.22.0
PROMETHEUS_VERSION=v0.316.0 # the Go module of Prometheus 3.16.0: cmd/promtool
bin="$(cd "$(dirname "$0")/../.." && pwd)/bin"
mkdir -p "$bin"
# One build at a time (the real-cluster e2e may call this while make deps runs).
exec 9>"$bin/.install-tools.lock"
flock 9
install() { # name module@version [ldflags]
  local stamp="$bin/.$1-${2##*@}"
  if [ -x "$bin/$1" ] && [ -e "$stamp" ]; then
    return
  fi
  echo "building $1 ($2) into $bin" >&2
  GOBIN="$bin" go install -ldflags "${3:-}" "$2"
  rm -f "$bin/.$1-"*
  touch "$stamp"
}
# As helm's own Makefile stamps them: its version, and the Kubernetes version that
# `helm template` and `helm lint` assume without a cluster (that of its client-go,
# v0.37: 1.37; unset, it is 1.20 and the chart's kubeVersion refuses it).
h=helm.sh/helm/v3
install helm $h/cmd/helm@$HELM_VERSION "-X $h/internal/version.version=$HELM_VERSION \
  -X $h/pkg/chartutil.k8sVersionMajor=1 -X $h/pkg/chartutil.k8sVersionMinor=37 \
  -X $h/pkg/lint/rules.k8sVersionMajor=1 -X $h/pkg/lint/rules.k8sVersionMinor=37"
# Without its service discoveries (Prometheus' remove_all_sd build tag): the rules need
# none, and the cloud SDKs they pull in were most of the build's time.
GOFLAGS="${GOFLAGS:+$GOFLAGS }-tags=remove_all_sd" install promtool github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION
# promqlcheck: this repository's check that the dashboard's and the rules' selectors name
# exported metrics (its own module: Prometheus' PromQL parser, at the version above).
(cd "$(dirname "$0")/promqlcheck" && go build -o "$bin/promqlcheck" .)
