package e2e

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// TestDetectLocalModes: --detect-local-mode NodeCIDR and InterfaceNamePrefix with real
// packets, without --cluster-cidr. Traffic to a cluster IP from a pod
// on the node (source in the Node's podCIDR 10.244.1.0/24, entering through a pod veth
// <prefix>pN) keeps its source; traffic from the node itself and from off the cluster is
// masqueraded. Under ClusterCIDR without --cluster-cidr none of it would be.
func TestDetectLocalModes(t *testing.T) {
	cluster.Require(t)
	e := newEnv(t, 2)
	c := e.c
	e.setupRoutes(t)
	base := []string{
		"--kubeconfig", c.LeastPrivilegeKubeconfigT(t),
		"--hostname-override", c.NodeName,
		"--min-sync-period", "100ms",
		"-v=2",
	}
	for _, mode := range []struct {
		name  string
		args  []string
		match string // the local check in the table
	}{
		{"NodeCIDR", []string{"--detect-local-mode=NodeCIDR"}, "ip saddr != 10.244.1.0/24 jump mark-for-masquerade"},
		{"InterfaceNamePrefix", []string{"--detect-local-mode=InterfaceNamePrefix", "--pod-interface-name-prefix=" + c.Prefix + "p"},
			`iifname != "` + c.Prefix + `p*" jump mark-for-masquerade`},
	} {
		t.Run(mode.name, func(t *testing.T) {
			var err error
			e.args = append(append([]string(nil), base...), mode.args...)
			e.proxy, err = c.StartProcess(c.NodeNS, "nftproxy", append([]string{e.bin}, e.args...)...)
			if err != nil {
				t.Fatal(err)
			}
			defer e.proxy.Stop()
			e.waitFirstSync(t)
			name := "local-" + strings.ToLower(mode.name)
			svc := e.createService(t, name, corev1.ServiceTypeClusterIP, nil, tcpPort("http", 8080, 8080))
			e.putSlice(t, svc, endpoint(e.web[0], ready), endpoint(e.web[1], ready))
			addr := hostPort(svc.Spec.ClusterIP, 8080)
			backends := e.web[:2]

			e.waitOK(t, "ClusterIP answers from a pod", e.client.NS, "tcp", addr)
			// the service is on the flat path: its cluster IP is marked in the shared
			// chain cluster-frontend
			table, err := e.nftList(t.Context())
			_, front, _ := strings.Cut(table, "chain cluster-frontend {")
			front, _, _ = strings.Cut(front, "}")
			if err != nil || !strings.Contains(table, svc.Spec.ClusterIP+" . tcp . 8080") || !strings.Contains(front, mode.match) {
				t.Fatalf("no %q in chain cluster-frontend, or %s not in the table (err %v):\n%s", mode.match, svc.Spec.ClusterIP, err, table)
			}
			res := e.probe(t, e.client.NS, "tcp", addr, 20, 2e9)
			expectAnswered(t, "pod -> "+addr+" (local: source kept)", res, backends, is(e.client.IP.String()))

			e.waitOK(t, "ClusterIP answers from the external client", c.ExternalNS, "tcp", addr)
			res = e.probe(t, c.ExternalNS, "tcp", addr, 20, 2e9)
			expectAnswered(t, "external -> "+addr+" (not local: masqueraded)", res, backends, isNot(c.ExternalIP.String()))

			e.waitOK(t, "ClusterIP answers from the node", c.NodeNS, "tcp", addr)
			res = e.probe(t, c.NodeNS, "tcp", addr, 20, 2e9)
			expectAnswered(t, "node -> "+addr+" (not local: masqueraded)", res, backends, isNot(c.NodeIP.String()))
		})
	}
}
