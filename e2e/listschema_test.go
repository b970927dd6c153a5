package e2e

import (
	"context"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
	"github.com/nftproxy/nftproxy/e2e/kind"
)

// TestListSchema checks what `nftproxy list -o json` prints for a live table against
// docs/schema/list-v1.json, with a service of every kind the schema describes: a
// ClusterIP with session affinity, node ports with a Local policy (with and without an
// endpoint on this node), a load balancer with source ranges and an external IP, and a
// service without endpoints. The kind e2e validates the listing of a kind cluster's nodes
// too; this one reaches the fields a default kind cluster does not have.
func TestListSchema(t *testing.T) {
	cluster.Require(t)
	schema, err := kind.ListSchema()
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, 2)
	e.startProxy(t, e.c.LeastPrivilegeKubeconfigT(t), cluster.WatchedFlags...)

	svc := func(name string, spec corev1.ServiceSpec, eps ...discoveryv1.Endpoint) {
		t.Helper()
		if spec.Ports == nil {
			spec.Ports = []corev1.ServicePort{tcpPort("http", 80, 8080)}
		}
		s := e.nsService(t, ns, name, spec)
		e.putSlice(t, s, eps...)
		if spec.Type == corev1.ServiceTypeLoadBalancer {
			e.setIngress(t, s, lbIP)
		}
	}
	remote := endpoint(e.web[1], ready)
	remote.NodeName = ptr.To("node-2")
	svc("ls-affinity", corev1.ServiceSpec{SessionAffinity: corev1.ServiceAffinityClientIP,
		SessionAffinityConfig: &corev1.SessionAffinityConfig{ClientIP: &corev1.ClientIPConfig{TimeoutSeconds: ptr.To[int32](300)}}},
		endpoint(e.web[0], ready), endpoint(e.web[1], ready))
	svc("ls-local", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal},
		endpoint(e.web[0], ready), remote)
	svc("ls-remote-only", corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, ExternalTrafficPolicy: corev1.ServiceExternalTrafficPolicyLocal}, remote)
	svc("ls-lb", corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, ExternalIPs: []string{externalIP},
		LoadBalancerSourceRanges: []string{"203.0.113.0/24"}}, endpoint(e.web[1], ready))
	svc("ls-noeps", corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080), udpPort("dns", 53, 5353)}})

	type frontend struct {
		Type, Address, Action, TrafficPolicy string
		AffinityTimeoutSeconds               uint32
		SourceRanges                         []string
		Endpoints                            []struct {
			Address string
			Local   bool
		}
	}
	type port struct {
		Service   string
		Protocol  string
		Frontends []frontend
	}
	want := []string{"default/ls-affinity:http", "default/ls-local:http", "default/ls-remote-only:http", "default/ls-lb:http", "default/ls-noeps:http", "default/ls-noeps:dns"}
	var out []byte
	var ports []port
	deadline := time.Now().Add(converge)
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		// stdout alone: warnings go to stderr
		cmd := exec.CommandContext(ctx, "ip", cluster.InNetns(e.c.NodeNS, e.bin, "list", "-o", "json")[1:]...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err = cmd.Output()
		cancel()
		if err != nil {
			t.Fatalf("nftproxy list -o json: %v\n%s", err, stderr.String())
		}
		if err := json.Unmarshal(out, &ports); err != nil {
			t.Fatalf("nftproxy list -o json: %v\n%s", err, out)
		}
		var have []string
		for _, p := range ports {
			have = append(have, p.Service)
		}
		missing := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return slices.Contains(have, s) })
		if len(missing) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nftproxy list -o json: no %v after %s:\n%s", missing, converge, out)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if err := kind.ValidateList(schema, out); err != nil {
		t.Fatalf("nftproxy list -o json does not match docs/schema/list-v1.json: %v\n%s", err, out)
	}

	// The listing has every field the schema names, so that validating it means something.
	seen := map[string]bool{}
	for _, p := range ports {
		for _, f := range p.Frontends {
			seen["type "+f.Type] = true
			seen["action "+f.Action] = true
			seen["policy "+f.TrafficPolicy] = true
			if f.AffinityTimeoutSeconds == 300 {
				seen["affinity 300"] = true
			}
			if slices.Contains(f.SourceRanges, "203.0.113.0/24") {
				seen["source range"] = true
			}
			for _, ep := range f.Endpoints {
				if ep.Local {
					seen["local endpoint"] = true
				}
			}
		}
	}
	for _, w := range []string{"type ClusterIP", "type External", "type NodePort", "action dnat", "action reject", "action drop",
		"policy Local", "policy Cluster", "affinity 300", "source range", "local endpoint"} {
		if !seen[w] {
			t.Errorf("nftproxy list -o json has no frontend with %s:\n%s", w, out)
		}
	}
	t.Logf("nftproxy list -o json: %d service ports, %d bytes, valid against docs/schema/list-v1.json", len(ports), len(out))
}
