package cluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// WatchedFlags are the flags of an nftproxy the suites watch closely: a sync at most every
// 100 ms, logs at -v=2, health checks on every address (port 10256) and metrics on
// loopback (port 10249).
var WatchedFlags = []string{
	"--min-sync-period", "100ms",
	"-v=2",
	"--healthz-bind-address", "0.0.0.0:10256",
	"--metrics-bind-address", "127.0.0.1:10249",
}

// NftproxyArgs are nftproxy's flags on node `node` of a harness cluster: the kubeconfig,
// the node's name and the cluster CIDR(s), then extra.
func NftproxyArgs(kubeconfig, node, clusterCIDR string, extra ...string) []string {
	return append([]string{
		"--kubeconfig", kubeconfig,
		"--hostname-override", node,
		"--cluster-cidr", clusterCIDR,
	}, extra...)
}

// BuildNftproxy builds ./cmd/nftproxy (static: CGO_ENABLED=0) of this source tree into bin.
func BuildNftproxy(ctx context.Context, bin string) error {
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/nftproxy")
	cmd.Dir = filepath.Dir(e2eDir())
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("go build ./cmd/nftproxy: %w\n%s", err, out)
	}
	return nil
}
