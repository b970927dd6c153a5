package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

// testUpstreamMetrics checks, on the running proxy, what kube-proxy's metrics port has
// beyond the sync metrics: the no-local-endpoints gauge following a
// Local service's endpoint between nodes, network programming latency observed from a
// slice's trigger time, the conntrack reconciler and client-go's rest_client_* series,
// the /configz, /flagz and /statusz pages, no profiling without --profiling; and
// verify reading the proxy's settings from /configz.
func (e *env) testUpstreamMetrics(t *testing.T) {
	noLocal := `kubeproxy_sync_proxy_rules_no_local_endpoints_total{ip_family="IPv4",traffic_policy="internal"}`
	programmed := `kubeproxy_network_programming_duration_seconds_count{ip_family="IPv4"}`
	before := e.scrape(t)
	base, timedBefore := metricValue(before, noLocal), metricValue(before, programmed)

	local := corev1.ServiceInternalTrafficPolicyLocal
	svc, err := e.c.Client.CoreV1().Services(ns).Create(t.Context(), &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "local-only"},
		Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{tcpPort("http", 80, 8080)}, InternalTrafficPolicy: &local},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.svcs = append(e.svcs, svc.Name)
	put := func(node string) time.Time {
		t.Helper()
		ep := endpoint(e.web[0], ready)
		ep.NodeName = ptr.To(node)
		trigger := time.Now()
		upsertSlice(t, e.c, &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{Name: svc.Name + "-e2e", Namespace: ns,
				Labels:      map[string]string{discoveryv1.LabelServiceName: svc.Name, discoveryv1.LabelManagedBy: "e2e"},
				Annotations: map[string]string{corev1.EndpointsLastChangeTriggerTime: trigger.UTC().Format(time.RFC3339Nano)}},
			AddressType: discoveryv1.AddressTypeIPv4,
			Endpoints:   []discoveryv1.Endpoint{ep},
			Ports:       slicePorts(svc.Spec.Ports...),
		})
		return trigger
	}
	waitMetric := func(what, name string, ok func(float64) bool) string {
		t.Helper()
		var m string
		for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if m = e.scrape(t); ok(metricValue(m, name)) {
				return m
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: %s = %v after 15 s", what, name, metricValue(m, name))
			}
		}
	}

	// the only endpoint on another node: internal traffic is dropped here, counted
	put("node-2")
	m := waitMetric("Local service with its endpoint elsewhere", noLocal, func(v float64) bool { return v == base+1 })
	if timed := metricValue(m, programmed); timed < timedBefore+1 {
		t.Errorf("%s = %v, want >= %v: the slice's change was not timed from its trigger time", programmed, timed, timedBefore+1)
	}
	// the endpoint moves to this node: no longer counted, and answered from here
	put(e.c.NodeName)
	m = waitMetric("Local service with a local endpoint", noLocal, func(v float64) bool { return v == base })
	e.waitOK(t, "local-only answers from its local endpoint", e.client.NS, "tcp", hostPort(svc.Spec.ClusterIP, 80))
	if timed := metricValue(m, programmed); timed < timedBefore+2 {
		t.Errorf("%s = %v, want >= %v", programmed, timed, timedBefore+2)
	}
	for _, name := range []string{
		`kubeproxy_conntrack_reconciler_sync_duration_seconds_count{ip_family="IPv4"}`,
		`rest_client_requests_total`,
		`rest_client_request_duration_seconds_count`,
	} {
		if v := metricValue(m, name); v <= 0 {
			t.Errorf("%s = %v, want > 0", name, v)
		}
	}
	if !strings.Contains(m, "# TYPE kubeproxy_conntrack_reconciler_deleted_entries_total counter") {
		t.Error("no kubeproxy_conntrack_reconciler_deleted_entries_total")
	}

	get := func(path string) (string, error) {
		out, err := e.c.Exec(t.Context(), e.c.NodeNS, "curl", "-sf", "http://127.0.0.1:10249"+path)
		return string(out), err
	}
	body, err := get("/configz")
	var cz map[string]struct {
		ClusterCIDR     string `json:"clusterCIDR"`
		EnableProfiling bool   `json:"enableProfiling"`
	}
	if err != nil || json.Unmarshal([]byte(body), &cz) != nil || cz["kubeproxy.config.k8s.io"].ClusterCIDR != clusterCIDR {
		t.Errorf("/configz: %v\n%s", err, body)
	}
	if body, err := get("/flagz"); err != nil || !strings.Contains(body, "nftproxy flagz") || !strings.Contains(body, "\ncluster-cidr: "+clusterCIDR+"\n") {
		t.Errorf("/flagz: %v\n%s", err, body)
	}
	if body, err := get("/statusz"); err != nil || !strings.Contains(body, "nftproxy statusz") || !strings.Contains(body, "/metrics") {
		t.Errorf("/statusz: %v\n%s", err, body)
	}
	if body, err := get("/debug/pprof/"); err == nil {
		t.Errorf("/debug/pprof/ served without --profiling:\n%.200s", body)
	}

	// verify with the API client's settings only: the rest comes from /configz, asked
	// for explicitly (it is unauthenticated)
	out, err := e.c.Exec(t.Context(), e.c.NodeNS, e.bin, "verify", "--from-configz", "--kubeconfig", e.c.LeastPrivilegeKubeconfigT(t), "--wait", "30s")
	if err != nil || !strings.Contains(string(out), "using the running proxy's settings from http://127.0.0.1:10249/configz") ||
		!strings.Contains(string(out), "equal: ") {
		t.Errorf("verify without the proxy's flags: %v\n%s", err, out)
	}
}
