// Package realcluster runs a throw-away two-node Kubernetes v1.37.0 cluster inside
// network namespaces — etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
// CoreDNS, and per node containerd + kubelet in a private mount namespace — and installs
// the service proxy under test through the API (nftproxy from manifests/, or kube-proxy
// as a DaemonSet). Its tests are the CI smoke (TestRealClusterSmoke), upstream's e2e.test
// Services suite (TestConformance) and the disruption measurements (TestDisruption).
// Layout, tear-down and requirements: README.md in this directory.
package realcluster
