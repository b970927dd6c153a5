package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// EchoPorts are the TCP and UDP ports every pod's echo server listens on.
var EchoPorts = []int{8080, 9090}

// Pod is a network namespace attached to the node like a Calico workload.
type Pod struct {
	Name   string
	NS     string     // network namespace
	IP     netip.Addr // 10.244.1.X
	HostIf string     // node side of the pod's veth

	echo *Process
}

// AddPod creates a pod namespace with the next free IP of the node's pod CIDR, wires it
// to the node with a point-to-point veth and starts the echo server (POD_NAME=name).
func (c *Cluster) AddPod(ctx context.Context, name string) (*Pod, error) {
	c.mu.Lock()
	if _, dup := c.pods[name]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("pod %q already exists", name)
	}
	octet := c.nextPod
	c.nextPod++
	c.mu.Unlock()
	if octet > 254 {
		return nil, fmt.Errorf("pod CIDR %s exhausted", c.NodePodCIDR)
	}
	ip := c.NodePodCIDR.Addr().As4()
	ip[3] = byte(octet)
	p := &Pod{
		Name:   name,
		NS:     fmt.Sprintf("%s-pod%d", c.Prefix, octet),
		IP:     netip.AddrFrom4(ip),
		HostIf: fmt.Sprintf("%sp%d", c.Prefix, octet),
	}
	if err := c.wirePod(ctx, p); err != nil {
		_ = c.RemovePod(p)
		return nil, fmt.Errorf("add pod %s: %w", name, err)
	}
	c.mu.Lock()
	c.pods[name] = p
	c.mu.Unlock()
	return p, nil
}

func (c *Cluster) wirePod(ctx context.Context, p *Pod) error {
	if err := c.addNetns(ctx, p.NS); err != nil {
		return err
	}
	if out, err := c.Exec(ctx, p.NS, "sysctl", "-qw", "net.ipv4.icmp_ratelimit=0"); err != nil {
		return fmt.Errorf("sysctl: %w: %s", err, out)
	}
	if err := c.ip(ctx, c.NodeNS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", p.HostIf, p.NS),
		fmt.Sprintf("addr add %s/32 dev %s", podGateway, p.HostIf),
		fmt.Sprintf("link set %s up", p.HostIf),
		fmt.Sprintf("route add %s/32 dev %s", p.IP, p.HostIf),
	); err != nil {
		return err
	}
	if err := c.ip(ctx, p.NS,
		fmt.Sprintf("addr add %s/32 dev eth0", p.IP),
		"link set eth0 up",
		fmt.Sprintf("route add %s dev eth0 scope link", podGateway),
		fmt.Sprintf("route add default via %s dev eth0", podGateway),
	); err != nil {
		return err
	}
	ports := make([]string, len(EchoPorts))
	for i, port := range EchoPorts {
		ports[i] = strconv.Itoa(port)
	}
	echo, err := c.startProcess(p.NS, "pod-"+p.Name, []string{"POD_NAME=" + p.Name}, c.echoBin, "serve", "--ports", strings.Join(ports, ","))
	if err != nil {
		return err
	}
	p.echo = echo
	// The server logs "ready pid=N" once all its sockets are bound (the log is appended
	// to when a pod name is reused, hence the pid).
	ready := fmt.Sprintf("ready pid=%d", echo.PID())
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(echo.Tail(5), ready) {
		if !echo.Running() || time.Now().After(deadline) {
			return fmt.Errorf("echo server did not become ready; log %s:\n%s", echo.Log, echo.Tail(10))
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// RemovePod stops the pod's echo server and deletes its namespace (and so its veth).
func (c *Cluster) RemovePod(p *Pod) error {
	if p.echo != nil {
		p.echo.Stop()
	}
	c.mu.Lock()
	if c.pods[p.Name] == p {
		delete(c.pods, p.Name)
	}
	c.mu.Unlock()
	return c.delNetns(p.NS)
}

// ProbeSpec describes a series of connection attempts made by the echo binary.
type ProbeSpec struct {
	Proto    string        // "tcp" or "udp"
	Addr     string        // ip:port
	Count    int           // attempts; default 1
	Timeout  time.Duration // per attempt; default 1s
	Interval time.Duration // pause between attempts
}

// ProbeResult is the outcome of one attempt.
type ProbeResult struct {
	OK      bool    `json:"ok"`
	Pod     string  `json:"pod"`    // POD_NAME of the server that answered
	Client  string  `json:"client"` // ip:port of the client as seen by the server
	Err     string  `json:"err"`
	Refused bool    `json:"refused"` // ECONNREFUSED (TCP RST or ICMP port unreachable)
	Millis  float64 `json:"ms"`
}

// Probe runs the echo binary's probe mode inside ns and returns one result per attempt.
func (c *Cluster) Probe(ctx context.Context, ns string, p ProbeSpec) ([]ProbeResult, error) {
	if p.Count <= 0 {
		p.Count = 1
	}
	if p.Timeout <= 0 {
		p.Timeout = time.Second
	}
	bound := time.Duration(p.Count)*(p.Timeout+p.Interval) + 10*time.Second
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out, err := c.Exec(ctx, ns, c.echoBin, "probe", "--proto", p.Proto, "--addr", p.Addr,
		"--count", fmt.Sprint(p.Count), "--timeout", p.Timeout.String(), "--interval", p.Interval.String())
	if err != nil {
		return nil, fmt.Errorf("probe %s %s from %s: %w: %s", p.Proto, p.Addr, ns, err, out)
	}
	var res []ProbeResult
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var r ProbeResult
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return nil, fmt.Errorf("probe output %q: %w", line, err)
		}
		res = append(res, r)
	}
	if len(res) != p.Count {
		return res, fmt.Errorf("probe: got %d results, want %d:\n%s", len(res), p.Count, out)
	}
	return res, nil
}

var (
	buildMu    sync.Mutex
	buildCache = map[string]string{} // outDir -> echo binary
)

// BuildBinaries builds the echo tool into outDir (once per process and outDir).
func BuildBinaries(ctx context.Context, outDir string) (echo string, err error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if bin, ok := buildCache[outDir]; ok {
		if _, err := os.Stat(bin); err == nil {
			return bin, nil
		}
	}
	bin := filepath.Join(outDir, "echo")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./echo")
	cmd.Dir = e2eDir()
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build echo: %w: %s", err, out)
	}
	buildCache[outDir] = bin
	return bin, nil
}
