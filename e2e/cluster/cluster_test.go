package cluster_test

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const helperEnv = "NFTPROXY_E2E_HELPER_KUBECONFIG"

func TestCluster(t *testing.T) {
	c := cluster.StartT(t, cluster.Config{})
	ctx := t.Context()

	a, err := c.AddPod(ctx, "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.AddPod(ctx, "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	if a.IP != netip.MustParseAddr("10.244.1.2") || b.IP != netip.MustParseAddr("10.244.1.3") {
		t.Fatalf("pod IPs %s, %s; want 10.244.1.2, 10.244.1.3", a.IP, b.IP)
	}

	// expect probes every echo port of dst from ns and wants all answers from dst,
	// seeing the client as clientIP.
	expect := func(t *testing.T, ns string, dst *cluster.Pod, clientIP string) {
		t.Helper()
		for _, proto := range []string{"tcp", "udp"} {
			for _, port := range cluster.EchoPorts {
				addr := net.JoinHostPort(dst.IP.String(), fmt.Sprint(port))
				res, err := c.Probe(ctx, ns, cluster.ProbeSpec{Proto: proto, Addr: addr, Count: 3, Timeout: 2 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range res {
					host, _, _ := net.SplitHostPort(r.Client)
					if !r.OK || r.Pod != dst.Name || host != clientIP {
						t.Errorf("%s %s from %s: %+v; want answer from %s seeing client %s", proto, addr, ns, r, dst.Name, clientIP)
					}
				}
			}
		}
	}
	// The control plane runs an etcd that serves the API server's progress requests
	// (3.4.31+, 3.5.13+), so the API server streams lists to watch-list clients, as
	// client-go's informers ask since v1.35: with Debian's etcd 3.4.23 the watch below
	// ends in an error event and the informers fall back to LIST.
	t.Run("watch-list", func(t *testing.T) {
		if !strings.HasPrefix(c.EtcdVersion, "3.") || c.EtcdVersion < "3.6" && os.Getenv(cluster.EtcdEnv) == "" {
			t.Errorf("etcd version %q; want the 3.6+ build-etcd.sh builds", c.EtcdVersion)
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		w, err := c.Client.CoreV1().Namespaces().Watch(wctx, metav1.ListOptions{
			SendInitialEvents:    ptr.To(true),
			AllowWatchBookmarks:  true,
			ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
		})
		if err != nil {
			t.Fatal(err)
		}
		defer w.Stop()
		var initial []string
		for ev := range w.ResultChan() {
			switch ev.Type {
			case watch.Added:
				initial = append(initial, ev.Object.(*corev1.Namespace).Name)
				continue
			case watch.Bookmark:
				if ev.Object.(*corev1.Namespace).Annotations[metav1.InitialEventsAnnotationKey] != "true" {
					continue
				}
				if !slices.Contains(initial, "default") || !slices.Contains(initial, "kube-system") {
					t.Errorf("initial events %q lack default or kube-system", initial)
				}
				return
			}
			t.Fatalf("watch-list: %s event before the initial events ended: %+v", ev.Type, ev.Object)
		}
		t.Fatalf("watch-list: the stream ended before the initial-events-end bookmark (initial events %q)", initial)
	})
	t.Run("pod-to-pod", func(t *testing.T) {
		expect(t, a.NS, b, a.IP.String())
		expect(t, b.NS, a, b.IP.String())
	})
	t.Run("node-to-pod", func(t *testing.T) {
		// The node reaches pods from the address on their veth (like Calico).
		expect(t, c.NodeNS, a, "169.254.1.1")
	})
	t.Run("external-to-pod", func(t *testing.T) {
		expect(t, c.ExternalNS, b, c.ExternalIP.String())
	})
	t.Run("refused", func(t *testing.T) {
		for _, proto := range []string{"tcp", "udp"} {
			res, err := c.Probe(ctx, a.NS, cluster.ProbeSpec{Proto: proto, Addr: b.IP.String() + ":7", Count: 8, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range res { // more than the ICMP burst: the rate limit is off in pods
				if r.OK || !r.Refused {
					t.Errorf("%s to closed port: %+v; want refused", proto, r)
				}
			}
		}
	})

	t.Run("ipv6", func(t *testing.T) {
		if a.IPv6 != netip.MustParseAddr("fd00:244:0:1::2") || b.IPv6 != netip.MustParseAddr("fd00:244:0:1::3") {
			t.Fatalf("pod IPv6 addresses %s, %s; want fd00:244:0:1::2, fd00:244:0:1::3", a.IPv6, b.IPv6)
		}
		expect6(t, c, a.NS, b, a.IPv6.String())
		expect6(t, c, c.ExternalNS, a, c.ExternalIPv6.String())
		expect6(t, c, c.NodeNS, b, c.NodeIPv6.String()) // the pod veth has only link-local addresses
	})
	t.Run("fixed-source-port", func(t *testing.T) {
		addr := net.JoinHostPort(b.IP.String(), "9090")
		res, err := c.Probe(ctx, a.NS, cluster.ProbeSpec{Proto: "udp", Addr: addr, Count: 3, SourcePort: 40123})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			if !r.OK || r.Client != a.IP.String()+":40123" || r.At.IsZero() {
				t.Errorf("udp %s from port 40123: %+v; want answered, client %s:40123, start time", addr, r, a.IP)
			}
		}
	})
	t.Run("background-probe", func(t *testing.T) {
		run, err := c.StartProbe(ctx, a.NS, cluster.ProbeSpec{Proto: "udp", Addr: net.JoinHostPort(b.IPv6.String(), "8080"),
			Count: 1000, Interval: 20 * time.Millisecond, Timeout: 200 * time.Millisecond, SourcePort: 40124})
		if err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(5 * time.Second)
		for len(run.Results()) < 5 && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		res, err := run.Stop()
		if err != nil || len(res) < 5 || len(res) >= 1000 {
			t.Fatalf("background probe: %d results, err %v; want 5..999", len(res), err)
		}
		for _, r := range res {
			if !r.OK || r.Pod != b.Name || r.Client != "["+a.IPv6.String()+"]:40124" {
				t.Errorf("background probe result %+v", r)
			}
		}
	})
	t.Run("default-route", func(t *testing.T) {
		for _, fam := range []string{"-4", "-6"} {
			out, err := c.Exec(ctx, c.NodeNS, "ip", fam, "route", "show", "default")
			want := c.ExternalIP.String()
			if fam == "-6" {
				want = c.ExternalIPv6.String()
			}
			if err != nil || !strings.Contains(string(out), "via "+want) {
				t.Errorf("ip %s route show default in %s: %v %q; want via %s", fam, c.NodeNS, err, out, want)
			}
		}
	})

	t.Run("api", func(t *testing.T) { testAPI(t, c, a, b) })
	t.Run("second-node", func(t *testing.T) { testSecondNode(t, c, a) })
	t.Run("kubeconfig-in-node-netns", func(t *testing.T) {
		self, err := os.Executable()
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", c.NodeNS, self, "-test.run=^TestKubeconfigHelper$", "-test.v")
		cmd.Env = append(os.Environ(), helperEnv+"="+c.Kubeconfig)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "node node-1 InternalIP 192.0.2.10") {
			t.Fatalf("client-go inside %s with %s: %v\n%s", c.NodeNS, c.Kubeconfig, err, out)
		}
	})

	t.Run("remove-pod", func(t *testing.T) {
		if err := c.RemovePod(b); err != nil {
			t.Fatal(err)
		}
		res, err := c.Probe(ctx, a.NS, cluster.ProbeSpec{Proto: "tcp", Addr: b.IP.String() + ":8080", Timeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if res[0].OK {
			t.Errorf("removed pod still answers: %+v", res[0])
		}
	})

	c.Stop()
	c.Stop() // idempotent
	out, err := exec.Command("ip", "netns", "list").CombinedOutput()
	if err != nil {
		t.Fatalf("ip netns list: %v: %s", err, out)
	}
	if strings.Contains(string(out), c.Prefix) {
		t.Errorf("namespaces with prefix %s left after Stop:\n%s", c.Prefix, out)
	}
	if _, err := os.Stat(c.WorkDir); os.Getenv("KEEP_E2E_WORKDIR") != "1" && !os.IsNotExist(err) {
		t.Errorf("workdir %s not removed: %v", c.WorkDir, err)
	}
}

// expect6 probes dst's echo ports over IPv6 from ns and wants every answer from dst,
// seeing the client as clientIP.
func expect6(t *testing.T, c *cluster.Cluster, ns string, dst *cluster.Pod, clientIP string) {
	t.Helper()
	for _, proto := range []string{"tcp", "udp"} {
		addr := net.JoinHostPort(dst.IPv6.String(), "8080")
		res, err := c.Probe(t.Context(), ns, cluster.ProbeSpec{Proto: proto, Addr: addr, Count: 3, Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range res {
			host, _, _ := net.SplitHostPort(r.Client)
			if !r.OK || r.Pod != dst.Name || host != clientIP {
				t.Errorf("%s %s from %s: %+v; want answer from %s seeing client %s", proto, addr, ns, r, dst.Name, clientIP)
			}
		}
	}
}

// testSecondNode adds node-2 with a pod and checks routing between the nodes' pods (no
// NAT: each side sees the other's pod address), from the external client, the Node
// object and the zone label.
func testSecondNode(t *testing.T, c *cluster.Cluster, a *cluster.Pod) {
	ctx := t.Context()
	n2, err := c.AddNode(ctx, "node-2")
	if err != nil {
		t.Fatal(err)
	}
	if n2.IP != netip.MustParseAddr("192.0.2.11") || n2.IPv6 != netip.MustParseAddr("fd00:192::11") ||
		n2.PodCIDR != netip.MustParsePrefix("10.244.2.0/24") || n2.PodCIDRv6 != netip.MustParsePrefix("fd00:244:0:2::/64") {
		t.Fatalf("node-2: %+v", n2)
	}
	if _, err := c.AddNode(ctx, "node-2"); err == nil {
		t.Error("a second node-2 was accepted")
	}
	if got := c.Nodes(); len(got) != 2 || got[0].Name != "node-1" || c.Node("node-2") != n2 {
		t.Errorf("Nodes() = %v", got)
	}
	p, err := c.AddPodOn(ctx, n2, "pod-c")
	if err != nil {
		t.Fatal(err)
	}
	if p.IP != netip.MustParseAddr("10.244.2.2") || p.IPv6 != netip.MustParseAddr("fd00:244:0:2::2") || p.Node != n2 {
		t.Fatalf("pod on node-2: %+v", p)
	}
	for _, x := range []struct {
		ns       string
		dst      *cluster.Pod
		v4, v6   string
		fromNode string
	}{
		{a.NS, p, a.IP.String(), a.IPv6.String(), "node-1 pod"},
		{p.NS, a, p.IP.String(), p.IPv6.String(), "node-2 pod"},
		{c.ExternalNS, p, c.ExternalIP.String(), c.ExternalIPv6.String(), "external client"},
	} {
		for _, addr := range []string{x.dst.IP.String(), x.dst.IPv6.String()} {
			res, err := c.Probe(ctx, x.ns, cluster.ProbeSpec{Proto: "tcp", Addr: net.JoinHostPort(addr, "8080"), Count: 2})
			if err != nil {
				t.Fatal(err)
			}
			want := x.v4
			if netip.MustParseAddr(addr).Is6() {
				want = x.v6
			}
			for _, r := range res {
				if host, _, _ := net.SplitHostPort(r.Client); !r.OK || r.Pod != x.dst.Name || host != want {
					t.Errorf("%s -> %s: %+v; want answer from %s seeing %s", x.fromNode, addr, r, x.dst.Name, want)
				}
			}
		}
	}
	// node-2 reaches the apiserver on node-1's LAN address.
	res, err := c.Probe(ctx, n2.NS, cluster.ProbeSpec{Proto: "tcp", Addr: net.JoinHostPort(c.NodeIP.String(), "6443"), Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(res[0].Err, "read ") { // connected; kube-apiserver sends no line
		t.Errorf("node-2 -> %s:6443: %+v; want a connection", c.NodeIP, res[0])
	}

	if err := c.SetZone(ctx, "node-2", "zone-b"); err != nil {
		t.Fatal(err)
	}
	node, err := c.Client.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	wantAddrs := []corev1.NodeAddress{
		{Type: corev1.NodeInternalIP, Address: "192.0.2.11"},
		{Type: corev1.NodeInternalIP, Address: "fd00:192::11"},
		{Type: corev1.NodeHostName, Address: "node-2"},
	}
	if fmt.Sprint(node.Status.Addresses) != fmt.Sprint(wantAddrs) || fmt.Sprint(node.Spec.PodCIDRs) != "[10.244.2.0/24 fd00:244:0:2::/64]" ||
		node.Labels[corev1.LabelTopologyZone] != "zone-b" {
		t.Errorf("node-2 object: addresses %v, podCIDRs %v, labels %v", node.Status.Addresses, node.Spec.PodCIDRs, node.Labels)
	}
	if err := c.SetZone(ctx, "node-2", ""); err != nil {
		t.Fatal(err)
	}
	if node, err = c.Client.CoreV1().Nodes().Get(ctx, "node-2", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	} else if _, ok := node.Labels[corev1.LabelTopologyZone]; ok {
		t.Errorf("zone label not removed: %v", node.Labels)
	}
}

func testAPI(t *testing.T, c *cluster.Cluster, a, b *cluster.Pod) {
	ctx := t.Context()
	node, err := c.Client.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(node.Status.Addresses) == 0 || node.Status.Addresses[0] != (corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: c.NodeIP.String()}) {
		t.Errorf("node addresses %v; want InternalIP %s", node.Status.Addresses, c.NodeIP)
	}

	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "echo"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{
			{Name: "tcp", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)},
			{Name: "udp", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(9090)},
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ip, err := netip.ParseAddr(svc.Spec.ClusterIP)
	if err != nil || !c.ServiceCIDR.Contains(ip) {
		t.Errorf("ClusterIP %q not in %s", svc.Spec.ClusterIP, c.ServiceCIDR)
	}

	var eps []discoveryv1.Endpoint
	for _, p := range []*cluster.Pod{a, b} {
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
			NodeName:   ptr.To(c.NodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: "default", Name: p.Name},
		})
	}
	_, err = c.Client.DiscoveryV1().EndpointSlices("default").Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   "echo-1",
			Labels: map[string]string{discoveryv1.LabelServiceName: "echo", discoveryv1.LabelManagedBy: "e2e"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{
			{Name: ptr.To("tcp"), Protocol: ptr.To(corev1.ProtocolTCP), Port: ptr.To[int32](8080)},
			{Name: ptr.To("udp"), Protocol: ptr.To(corev1.ProtocolUDP), Port: ptr.To[int32](9090)},
		},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	gotSvc, err := c.Client.CoreV1().Services("default").Get(ctx, "echo", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if gotSvc.Spec.ClusterIP != svc.Spec.ClusterIP || len(gotSvc.Spec.Ports) != 2 {
		t.Errorf("service read back: %+v", gotSvc.Spec)
	}
	slices, err := c.Client.DiscoveryV1().EndpointSlices("default").List(ctx, metav1.ListOptions{
		LabelSelector: discoveryv1.LabelServiceName + "=echo",
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(slices.Items) != 1 || len(slices.Items[0].Endpoints) != 2 ||
		slices.Items[0].Endpoints[1].Addresses[0] != b.IP.String() {
		t.Errorf("endpoint slices read back: %+v", slices.Items)
	}
}

// TestKubeconfigHelper runs as a child process inside the node netns (see
// "kubeconfig-in-node-netns"): it uses the kubeconfig the way nftproxy will.
func TestKubeconfigHelper(t *testing.T) {
	path := os.Getenv(helperEnv)
	if path == "" {
		t.Skip("helper process for TestCluster")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	node, err := cs.CoreV1().Nodes().Get(ctx, "node-1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range node.Status.Addresses {
		fmt.Printf("node %s %s %s\n", node.Name, a.Type, a.Address)
	}
}
