package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/options"
)

// kubeconfigFor is a kubeconfig as manifests/config.yaml ships it, with server's address.
func kubeconfigFor(server string) string {
	return `apiVersion: v1
kind: Config
clusters:
  - name: default
    cluster:
      server: ` + server + `
      certificate-authority: /var/run/secrets/kubernetes.io/serviceaccount/ca.crt
users:
  - name: default
    user:
      tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token
contexts:
  - name: default
    context:
      cluster: default
      user: default
current-context: default
`
}

// An unedited CONTROL_PLANE_ENDPOINT is refused before anything starts: one line that
// names the file and what to set, and exit code 2 (what the kubelet shows as the pod's
// last state), whether the kubeconfig comes from --kubeconfig or from --config's
// clientConnection.kubeconfig as in manifests/.
func TestPlaceholderRefused(t *testing.T) {
	dir := t.TempDir()
	placeholder := filepath.Join(dir, "kubeconfig.conf")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(placeholder, []byte(kubeconfigFor("https://CONTROL_PLANE_ENDPOINT:6443")), 0o600))
	real := filepath.Join(dir, "real.conf")
	must(os.WriteFile(real, []byte(kubeconfigFor("https://10.0.0.1:6443")), 0o600))
	cfgFile := filepath.Join(dir, "config.conf")
	must(os.WriteFile(cfgFile, []byte("apiVersion: kubeproxy.config.k8s.io/v1alpha1\nkind: KubeProxyConfiguration\n"+
		"clientConnection:\n  kubeconfig: "+placeholder+"\nclusterCIDR: 10.244.0.0/16\n"), 0o600))

	want := "nftproxy: the API server address in " + placeholder + " is still the placeholder CONTROL_PLANE_ENDPOINT: set it to your control plane's address"
	for _, args := range [][]string{
		{"--kubeconfig", placeholder, "--hostname-override=n1"},
		{"--config", cfgFile, "--hostname-override=n1"},
	} {
		var stderr bytes.Buffer
		fs, o := options.NewFlagSet()
		code, exit := configure(fs, o, args, &stderr)
		if code != 2 || !exit {
			t.Errorf("%q: code %d exit %v, want 2 true; stderr %q", args, code, exit, stderr.String())
		}
		if !strings.HasPrefix(stderr.String(), want) || strings.Count(stderr.String(), "\n") != 1 {
			t.Errorf("%q: stderr %q, want one line starting %q", args, stderr.String(), want)
		}
		// The subcommands, which build the client through clientConfig, say the same.
		if _, err := clientConfig(o); err == nil || !strings.Contains(err.Error(), "still the placeholder CONTROL_PLANE_ENDPOINT") {
			t.Errorf("%q: clientConfig error %v", args, err)
		}
	}

	// A real address, --master overriding the placeholder, and an unreadable file (left
	// to the client's own error) all go on.
	for _, args := range [][]string{
		{"--kubeconfig", real, "--hostname-override=n1"},
		{"--kubeconfig", placeholder, "--master", "https://10.0.0.1:6443", "--hostname-override=n1"},
		{"--kubeconfig", filepath.Join(dir, "missing.conf"), "--hostname-override=n1"},
	} {
		var stderr bytes.Buffer
		fs, o := options.NewFlagSet()
		if code, exit := configure(fs, o, args, &stderr); code != 0 || exit {
			t.Errorf("%q: code %d exit %v, want to go on; stderr %q", args, code, exit, stderr.String())
		}
	}
}
