package main

import (
	"fmt"
	"net/url"
	"strings"

	"k8s.io/client-go/tools/clientcmd"

	"github.com/nftproxy/nftproxy/internal/options"
)

// Placeholder is the API server host manifests/config.yaml ships in its kubeconfig, for
// the operator to replace with the control plane's address.
const Placeholder = "CONTROL_PLANE_ENDPOINT"

// checkPlaceholder refuses a kubeconfig whose API server address was left as
// Placeholder: without this, nftproxy would retry a DNS name that cannot resolve for
// minutes and then crash-loop without saying why. --master, which overrides the
// kubeconfig's address, makes the check moot. A kubeconfig that cannot be read is left
// to the client's own error.
func checkPlaceholder(o *options.Options) error {
	if o.Kubeconfig == "" || o.Master != "" {
		return nil
	}
	cfg, err := clientcmd.LoadFromFile(o.Kubeconfig)
	if err != nil {
		return nil
	}
	// The cluster the client would use: the current context's, else any (clientcmd
	// then refuses an incomplete file on its own).
	var servers []string
	if ctx, ok := cfg.Contexts[cfg.CurrentContext]; ok {
		if c, ok := cfg.Clusters[ctx.Cluster]; ok {
			servers = append(servers, c.Server)
		}
	} else {
		for _, c := range cfg.Clusters {
			servers = append(servers, c.Server)
		}
	}
	for _, s := range servers {
		host := s
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			host = u.Hostname()
		}
		if strings.EqualFold(host, Placeholder) {
			return fmt.Errorf("the API server address in %s is still the placeholder %s: set it to your control plane's address "+
				"(kubeadm: its controlPlaneEndpoint; Helm: --set apiServer.host=...), or give --master", o.Kubeconfig, Placeholder)
		}
	}
	return nil
}
