// Command demo shows nftproxy at work in a throw-away netns cluster (e2e/cluster):
// it starts the cluster, three backend pods and a client pod, runs nftproxy in the
// node namespace, creates two services, prints the resulting nftables table and
// sends traffic through it. Everything is torn down at the end, on error and on
// Ctrl-C. Run as root from the repository root:
//
//	go run ./e2e/demo [-v]
//
// Nothing outside the cluster's own network namespaces is touched.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const ns = metav1.NamespaceDefault

func main() {
	verbose := flag.Bool("v", false, "also print the harness's own log lines")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, *verbose)
	interrupted := ctx.Err() != nil
	stop()
	switch {
	case err != nil && interrupted:
		fmt.Fprintf(os.Stderr, "\nDEMO INTERRUPTED (%v)\n", err)
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "\nDEMO FAILED: %v\n", err)
		os.Exit(1)
	}
	fmt.Println("\nDemo finished: everything torn down.")
}

func heading(s string) { fmt.Printf("\n== %s\n", s) }

func indent(s string) string {
	return "    " + strings.ReplaceAll(strings.TrimRight(s, "\n"), "\n", "\n    ")
}

func run(ctx context.Context, verbose bool) (err error) {
	if os.Geteuid() != 0 {
		return errors.New("must run as root (it creates network namespaces)")
	}
	tmp, err := os.MkdirTemp("", "nftproxy-demo-")
	if err != nil {
		return err
	}
	defer func() {
		if os.Getenv("KEEP_E2E_WORKDIR") == "1" {
			fmt.Printf("    keeping %s (KEEP_E2E_WORKDIR=1)\n", tmp)
			return
		}
		os.RemoveAll(tmp)
	}()
	workDir := filepath.Join(tmp, "cluster")

	heading("Build")
	bin := filepath.Join(tmp, "nftproxy")
	if err := cluster.BuildNftproxy(ctx, bin); err != nil {
		return err
	}
	echo, err := cluster.BuildBinaries(ctx, filepath.Join(workDir, "bin")) // reused by Start
	if err != nil {
		return err
	}
	fmt.Printf("    nftproxy  %s\n    echo      %s\n", bin, echo)

	heading("Cluster (etcd + kube-apiserver in a node netns; first run builds kube-apiserver and etcd)")
	cfg := cluster.Config{WorkDir: workDir}
	if verbose {
		cfg.Logf = func(format string, args ...any) { fmt.Printf("    | "+format+"\n", args...) }
	}
	c, err := cluster.Start(ctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		heading("Teardown")
		c.Stop()
		fmt.Printf("    stopped processes, deleted namespaces %s-*\n", c.Prefix)
	}()
	fmt.Printf("    node netns %s: node IP %s, pod CIDR %s, service CIDR %s, etcd %s\n", c.NodeNS, c.NodeIP, c.PodCIDR, c.ServiceCIDR, c.EtcdVersion)
	fmt.Printf("    external client netns %s: %s\n", c.ExternalNS, c.ExternalIP)

	var web []*cluster.Pod
	for _, name := range []string{"web-1", "web-2", "web-3"} {
		p, err := c.AddPod(ctx, name)
		if err != nil {
			return err
		}
		web = append(web, p)
		fmt.Printf("    pod %-6s %s  (echo server on tcp+udp 8080, 9090)\n", p.Name, p.IP)
	}
	client, err := c.AddPod(ctx, "client")
	if err != nil {
		return err
	}
	fmt.Printf("    pod %-6s %s  (sends the in-cluster requests)\n", client.Name, client.IP)

	heading("nftproxy (in the node netns)")
	proxy, err := c.StartProcess(c.NodeNS, "nftproxy", append([]string{bin},
		cluster.NftproxyArgs(c.Kubeconfig, c.NodeName, c.PodCIDR.String(), cluster.WatchedFlags...)...)...)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			fmt.Printf("\n    nftproxy log (last 20 lines):\n%s\n", indent(proxy.Tail(20)))
		}
	}()
	fmt.Printf("    pid %d, log %s\n", proxy.PID(), proxy.Log)

	heading("Services")
	webSvc, err := createService(ctx, c, "web", corev1.ServiceTypeNodePort,
		corev1.ServicePort{Name: "http", Protocol: corev1.ProtocolTCP, Port: 80, TargetPort: intstr.FromInt32(8080)}, web)
	if err != nil {
		return err
	}
	dnsSvc, err := createService(ctx, c, "dns", corev1.ServiceTypeClusterIP,
		corev1.ServicePort{Name: "dns", Protocol: corev1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(9090)}, web[:2])
	if err != nil {
		return err
	}
	webAddr := net.JoinHostPort(webSvc.Spec.ClusterIP, "80")
	nodePortAddr := net.JoinHostPort(c.NodeIP.String(), fmt.Sprint(webSvc.Spec.Ports[0].NodePort))
	dnsAddr := net.JoinHostPort(dnsSvc.Spec.ClusterIP, "53")

	heading("Waiting for nftproxy to program them")
	start := time.Now()
	for _, w := range []struct{ ns, proto, addr string }{
		{client.NS, "tcp", webAddr}, {c.ExternalNS, "tcp", nodePortAddr}, {client.NS, "udp", dnsAddr},
	} {
		if err := waitOK(ctx, c, proxy, w.ns, w.proto, w.addr); err != nil {
			return err
		}
	}
	fmt.Printf("    all three frontends answer after %v\n", time.Since(start).Round(10*time.Millisecond))

	heading("nft list table ip nftproxy (node netns)")
	out, err := c.Exec(ctx, c.NodeNS, "nft", "list", "table", "ip", "nftproxy")
	if err != nil {
		return fmt.Errorf("nft list table ip nftproxy: %w\n%s", err, out)
	}
	fmt.Println(indent(string(out)))

	heading("Traffic")
	runs := []struct {
		title    string
		ns       string
		proto    string
		addr     string
		count    int
		backends []*cluster.Pod
	}{
		{"web ClusterIP from pod", client.NS, "tcp", webAddr, 30, web},
		{"web NodePort from external", c.ExternalNS, "tcp", nodePortAddr, 30, web},
		{"dns UDP from pod", client.NS, "udp", dnsAddr, 20, web[:2]},
	}
	counts := make([]map[string]int, len(runs))
	sources := make([]map[string]int, len(runs))
	var problems []string
	for i, r := range runs {
		res, err := c.Probe(ctx, r.ns, cluster.ProbeSpec{Proto: r.proto, Addr: r.addr, Count: r.count, Timeout: time.Second})
		if err != nil {
			return err
		}
		counts[i], sources[i] = map[string]int{}, map[string]int{}
		ok := 0
		for _, p := range res {
			if !p.OK {
				problems = append(problems, fmt.Sprintf("%s: attempt failed: %s", r.title, p.Err))
				continue
			}
			if !isBackend(p.Pod, r.backends) {
				problems = append(problems, fmt.Sprintf("%s: answered by %s, which is not an endpoint", r.title, p.Pod))
			}
			ok++
			counts[i][p.Pod]++
			host, _, _ := net.SplitHostPort(p.Client)
			sources[i][host]++
		}
		fmt.Printf("    %-28s %d x %s %-22s %d answered\n", r.title+":", r.count, strings.ToUpper(r.proto), r.addr, ok)
	}

	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 3, ' ', 0)
	header := "    pod"
	for _, r := range runs {
		header += "\t" + r.title
	}
	fmt.Fprintln(tw, header)
	for _, p := range web {
		row := "    " + p.Name
		for i := range runs {
			row += fmt.Sprintf("\t%d", counts[i][p.Name])
		}
		fmt.Fprintln(tw, row)
	}
	row := "    client seen as"
	for i := range runs {
		row += "\t" + keys(sources[i])
	}
	fmt.Fprintln(tw, row)
	tw.Flush()
	fmt.Printf("\n    (from the client pod the source %s is kept; external traffic is masqueraded\n"+
		"     to the node's address on the pod link, so %s never appears)\n", client.IP, c.ExternalIP)

	if len(problems) > 0 {
		return fmt.Errorf("%d problem(s):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	return nil
}

// createService creates a selector-less service and its EndpointSlice (all endpoints
// ready) and prints what the apiserver allocated.
func createService(ctx context.Context, c *cluster.Cluster, name string, typ corev1.ServiceType, port corev1.ServicePort, pods []*cluster.Pod) (*corev1.Service, error) {
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec:       corev1.ServiceSpec{Type: typ, Ports: []corev1.ServicePort{port}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create service %s: %w", name, err)
	}
	var eps []discoveryv1.Endpoint
	var names []string
	for _, p := range pods {
		eps = append(eps, discoveryv1.Endpoint{
			Addresses:  []string{p.IP.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To(c.NodeName),
			TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: p.Name},
		})
		names = append(names, p.Name)
	}
	_, err = c.Client.DiscoveryV1().EndpointSlices(ns).Create(ctx, &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name:   name + "-demo",
			Labels: map[string]string{discoveryv1.LabelServiceName: name, discoveryv1.LabelManagedBy: "demo"},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   eps,
		Ports: []discoveryv1.EndpointPort{{
			Name: ptr.To(port.Name), Protocol: ptr.To(port.Protocol), Port: ptr.To(port.TargetPort.IntVal)}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, fmt.Errorf("create endpoint slice for %s: %w", name, err)
	}
	p := svc.Spec.Ports[0]
	line := fmt.Sprintf("    %s/%s  %s  ClusterIP %s:%d/%s -> %d", ns, name, svc.Spec.Type, svc.Spec.ClusterIP, p.Port, p.Protocol, p.TargetPort.IntVal)
	if p.NodePort != 0 {
		line += fmt.Sprintf(", NodePort %d", p.NodePort)
	}
	fmt.Printf("%s\n      endpoints: %s\n", line, strings.Join(names, ", "))
	return svc, nil
}

// waitOK polls until one request from ns to addr is answered (at most 15 s).
func waitOK(ctx context.Context, c *cluster.Cluster, proxy *cluster.Process, ns, proto, addr string) error {
	deadline := time.Now().Add(15 * time.Second)
	for {
		res, err := c.Probe(ctx, ns, cluster.ProbeSpec{Proto: proto, Addr: addr, Timeout: 500 * time.Millisecond})
		if err != nil {
			return err
		}
		if res[0].OK {
			return nil
		}
		if !proxy.Running() {
			return errors.New("nftproxy exited")
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s %s still not answered after 15s (last: refused=%v %s)", proto, addr, res[0].Refused, res[0].Err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func isBackend(name string, pods []*cluster.Pod) bool {
	for _, p := range pods {
		if p.Name == name {
			return true
		}
	}
	return false
}

func keys(m map[string]int) string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	if len(ks) == 0 {
		return "-"
	}
	return strings.Join(ks, ",")
}
