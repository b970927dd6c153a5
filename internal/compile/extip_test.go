package compile

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// What an externalIP or load-balancer IP may not take from other namespaces: their pods'
// addresses (the pod's own node would hand the pod's traffic to the tenant a second
// time), and the node ports and health-check node ports on the node's addresses (the
// external frontends are matched first).

// frontendsAt lists every element of rs whose key starts with addr and names a
// frontend (dispatch maps, the flat path's frontend sets, the no-endpoint and
// no-local-endpoint sets, counters), as "set key".
func frontendsAt(rs *nft.Ruleset, addr netip.Addr) []string {
	var out []string
	for _, s := range rs.Flatten().Sets {
		if s.Name == SetClusterIPs || s.Name == SetNodePortIPs || s.Name == SetHairpin || strings.HasPrefix(s.Name, MapEndpoints) {
			continue
		}
		for _, e := range s.Elements {
			if len(e.Key) == 3 && e.Key[0].Addr() == addr {
				out = append(out, s.Name+" "+valuesString(e.Key))
			}
		}
	}
	slices.Sort(out)
	return out
}

func withExternal(sp model.ServicePort, ext ...string) model.ServicePort {
	sp.ExternalIPs = ips(ext...)
	return sp
}

func TestExternalIPsNeverTakeOtherNamespacesPods(t *testing.T) {
	// the victim's pod 10.244.1.80 (in the cluster CIDR) and a pod outside every
	// configured range, 100.64.0.5 (say, a CNI with its own pool)
	web := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80", "100.64.0.5")
	hostNet := nsPort("monitoring", "node-exporter", tcp, 9100, "10.96.0.30", 0)
	hostNet.Endpoints = eps(9100, "192.0.2.10")
	for _, tc := range []struct {
		name    string
		cfg     func(*Config)
		node    func(*model.Node)
		tenant  model.ServicePort
		addr    string
		refused bool
		problem string
	}{
		{
			name:    "inside --cluster-cidr",
			cfg:     func(c *Config) { c.ClusterCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")} },
			tenant:  withExternal(nsPort("tenant", "x", tcp, 8080, "10.96.5.1", time.Hour, "10.244.9.9"), "10.244.1.80"),
			addr:    "10.244.1.80",
			refused: true,
			problem: `Service tenant/x: externalIP 10.244.1.80 is inside the cluster CIDR 10.244.0.0/16 (pod addresses), refused`,
		},
		{
			name:    "inside the node's podCIDR, no --cluster-cidr",
			node:    func(n *model.Node) { n.PodCIDRs = []netip.Prefix{netip.MustParsePrefix("10.244.1.0/24")} },
			tenant:  withExternal(nsPort("tenant", "x", tcp, 9999, "10.96.5.1", time.Hour), "10.244.1.80"),
			addr:    "10.244.1.80",
			refused: true,
			problem: `Service tenant/x: externalIP 10.244.1.80 is inside this node's pod CIDR 10.244.1.0/24, refused`,
		},
		{
			name:    "an older Service's endpoint in another namespace, outside every range",
			tenant:  withExternal(nsPort("tenant", "x", tcp, 8080, "10.96.5.1", time.Hour, "10.244.9.9"), "100.64.0.5"),
			addr:    "100.64.0.5",
			refused: true,
			problem: `Service tenant/x: port "p": externalIP 100.64.0.5 TCP port 8080 is an endpoint of a Service in another namespace, refused`,
		},
		{
			name:    "the same without endpoints of its own (would reject the pod's traffic)",
			tenant:  withExternal(nsPort("tenant", "x", tcp, 8080, "10.96.5.1", time.Hour), "100.64.0.5"),
			addr:    "100.64.0.5",
			refused: true,
			problem: `externalIP 100.64.0.5 TCP port 8080 is an endpoint of a Service in another namespace, refused`,
		},
		{
			name:    "a host-network pod's endpoint on the node's address",
			tenant:  withExternal(nsPort("tenant", "x", tcp, 9100, "10.96.5.1", time.Hour, "10.244.9.9"), "192.0.2.10"),
			addr:    "192.0.2.10",
			refused: true,
			problem: `externalIP 192.0.2.10 TCP port 9100 is an endpoint of a Service in another namespace, refused`,
		},
		{
			name:   "another port of that address is free (an ingress on a node address)",
			tenant: withExternal(nsPort("tenant", "x", tcp, 443, "10.96.5.1", time.Hour, "10.244.9.9"), "192.0.2.10"),
			addr:   "192.0.2.10",
		},
		{
			name:   "the tenant's own pods",
			tenant: withExternal(nsPort("shop", "x", tcp, 8080, "10.96.5.1", time.Hour, "10.244.9.9"), "100.64.0.5"),
			addr:   "100.64.0.5",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig()
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			snap := snapshot(sortedPorts([]model.ServicePort{web, hostNet, tc.tenant})...)
			if tc.node != nil {
				tc.node(&snap.Node)
			}
			rs, problems := compileChecked(t, snap, cfg, NewSlots())
			got := frontendsAt(rs, ip(tc.addr))
			if tc.refused {
				if len(got) != 0 {
					t.Errorf("the tenant's externalIP %s is programmed: %v", tc.addr, got)
				}
				checkProblems(t, problems, []string{tc.problem})
				for _, p := range problems {
					if strings.Contains(p.Reason, "shop") || strings.Contains(p.Reason, "monitoring") {
						t.Errorf("the refusal names the other namespace: %s", p)
					}
				}
			} else {
				if len(got) == 0 {
					t.Errorf("the tenant's externalIP %s is not programmed", tc.addr)
				}
				checkProblems(t, problems, nil)
			}
		})
	}
}

// A tenant cannot take an existing externalIP away by writing an endpoint at it into a
// slice of a newer Service.
func TestEndpointOfNewerServiceDoesNotRefuseExternalIP(t *testing.T) {
	victim := withExternal(nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80"), "203.0.113.7")
	tenant := nsPort("tenant", "x", tcp, 80, "10.96.5.1", time.Hour, "203.0.113.7")
	tenant.Endpoints = eps(80, "203.0.113.7")
	rs, _ := compileChecked(t, snapshot(victim, tenant), testConfig(), NewSlots())
	if got := frontendsAt(rs, ip("203.0.113.7")); len(got) == 0 {
		t.Errorf("the victim's externalIP is gone")
	}
}

func TestNodePortsWinOnNodeAddresses(t *testing.T) {
	victim := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0, "10.244.1.80")
	victim.NodePort = 30080
	lb := nsPort("shop", "lb", tcp, 443, "10.96.0.21", 0, "10.244.1.81")
	lb.LoadBalancerIPs, lb.ExternalPolicyLocal, lb.HealthCheckNodePort = ips("198.51.100.9"), true, 32000
	for _, tc := range []struct {
		name, addr string
		port       uint16
		refused    bool
	}{
		{"a node port on the node's address", "192.0.2.10", 30080, true},
		{"a health-check node port on the node's address", "192.0.2.10", 32000, true},
		{"a node port on another address", "203.0.113.9", 30080, false},
		{"another port on the node's address", "192.0.2.10", 30081, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tenant := withExternal(nsPort("tenant", "x", tcp, tc.port, "10.96.5.1", time.Hour, "10.244.9.9"), tc.addr)
			rs, problems := compileChecked(t, snapshot(sortedPorts([]model.ServicePort{victim, lb, tenant})...), testConfig(), NewSlots())
			got := frontendsAt(rs, ip(tc.addr))
			switch {
			case tc.refused && len(got) != 0:
				t.Errorf("the tenant's externalIP %s:%d is programmed: %v", tc.addr, tc.port, got)
			case !tc.refused && len(got) == 0:
				t.Errorf("the tenant's externalIP %s:%d is not programmed", tc.addr, tc.port)
			}
			var want []string
			if tc.refused {
				want = []string{`Service tenant/x: port "p": externalIP ` + tc.addr + ` is this node's address and TCP port`}
			}
			checkProblems(t, problems, want)
			if np := elements(t, rs, MapServiceNodePorts); np["6 . 30080"] != "goto ext-shop/web/tcp/p" {
				t.Errorf("the victim's node port: %v", np)
			}
		})
	}
}

func TestExternalIPAllowList(t *testing.T) {
	cfg := testConfig()
	cfg.ExternalIPCIDRs = []netip.Prefix{netip.MustParsePrefix("203.0.113.0/24")}
	in := withExternal(nsPort("a", "in", tcp, 80, "10.96.5.1", 0, "10.244.9.1"), "203.0.113.5")
	out := withExternal(nsPort("b", "out", tcp, 80, "10.96.5.2", 0, "10.244.9.2"), "198.51.100.5")
	lb := nsPort("c", "lb", tcp, 80, "10.96.5.3", 0, "10.244.9.3")
	lb.LoadBalancerIPs = ips("198.51.100.6")
	rs, problems := compileChecked(t, snapshot(in, out, lb), cfg, NewSlots())
	if got := frontendsAt(rs, ip("203.0.113.5")); len(got) == 0 {
		t.Errorf("the externalIP inside --external-ip-cidrs is not programmed")
	}
	if got := frontendsAt(rs, ip("198.51.100.5")); len(got) != 0 {
		t.Errorf("the externalIP outside --external-ip-cidrs is programmed: %v", got)
	}
	if got := frontendsAt(rs, ip("198.51.100.6")); len(got) == 0 {
		t.Errorf("the load-balancer IP is not programmed: the allow-list is for externalIPs")
	}
	checkProblems(t, problems, []string{"Service b/out: externalIP 198.51.100.5 is outside the ranges the node allows externalIPs in (--external-ip-cidrs), refused"})
}

// The incremental compiler follows what the refusals depend on although the tenant's
// Service does not change: a pod of another namespace arriving at its externalIP, a node
// port allocated at its port, and both going away; at every step its output equals a
// fresh compilation's.
func TestExternalIPRefusalFollowsOthers(t *testing.T) {
	tenant := withExternal(nsPort("tenant", "x", tcp, 30080, "10.96.5.1", time.Hour, "10.244.9.9"), "100.64.0.5", "192.0.2.10")
	pod := nsPort("shop", "web", tcp, 80, "10.96.0.20", 0)
	pod.Endpoints = eps(30080, "100.64.0.5")
	np := nsPort("shop", "np", tcp, 81, "10.96.0.21", 0, "10.244.1.81")
	np.NodePort = 30080
	other := nsPort("shop", "other", tcp, 82, "10.96.0.22", 0, "10.244.1.82")
	cc := NewCompiler(testConfig(), NewSlots())
	for _, step := range []struct {
		name     string
		ports    []model.ServicePort
		pod, own bool // the tenant holds 100.64.0.5, 192.0.2.10
	}{
		{"alone", []model.ServicePort{tenant, other}, true, true},
		{"a pod arrives at its externalIP", []model.ServicePort{pod, tenant, other}, false, true},
		{"a node port is allocated at its port", []model.ServicePort{np, pod, tenant, other}, false, false},
		{"the pod goes", []model.ServicePort{np, tenant, other}, true, false},
		{"the node port goes", []model.ServicePort{tenant, other}, true, true},
	} {
		snap := snapshot(sortedPorts(step.ports)...)
		inc, _ := cc.Compile(snap)
		fresh, _ := compileChecked(t, snap, testConfig(), NewSlots())
		for addr, want := range map[string]bool{"100.64.0.5": step.pod, "192.0.2.10": step.own} {
			got, gotFresh := frontendsAt(inc, ip(addr)), frontendsAt(fresh, ip(addr))
			if (len(got) > 0) != want || !slices.Equal(got, gotFresh) {
				t.Errorf("%s: %s: incremental %v, fresh %v; want held %v", step.name, addr, got, gotFresh, want)
			}
		}
	}
}
