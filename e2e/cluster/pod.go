package cluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// EchoPorts are the TCP and UDP ports every pod's echo server listens on.
var EchoPorts = []int{8080, 9090}

// Pod is a network namespace attached to its node like a Calico workload.
type Pod struct {
	Name   string
	NS     string     // network namespace
	IP     netip.Addr // 10.244.N.X on node N
	IPv6   netip.Addr // fd00:244:0:N::X (X in hex)
	HostIf string     // node side of the pod's veth (in Node.NS)
	Node   *Node

	echo *Process
}

// AddPod adds a pod on node-1; see AddPodOn.
func (c *Cluster) AddPod(ctx context.Context, name string) (*Pod, error) {
	return c.AddPodOn(ctx, c.nodes[0], name)
}

// AddPodOn creates a pod namespace with the next free addresses of the node's pod CIDRs
// (IPv4 and IPv6), wires it to the node with a point-to-point veth and starts the echo
// server (POD_NAME=name). Pod names are unique in the cluster.
func (c *Cluster) AddPodOn(ctx context.Context, node *Node, name string) (*Pod, error) {
	c.mu.Lock()
	if _, dup := c.pods[name]; dup {
		c.mu.Unlock()
		return nil, fmt.Errorf("pod %q already exists", name)
	}
	octet := node.nextPod
	node.nextPod++
	c.mu.Unlock()
	if octet > 254 {
		return nil, fmt.Errorf("pod CIDR %s exhausted", node.PodCIDR)
	}
	ip := node.PodCIDR.Addr().As4()
	ip[3] = byte(octet)
	ip6 := node.PodCIDRv6.Addr().As16()
	ip6[15] = byte(octet)
	p := &Pod{
		Name:   name,
		NS:     fmt.Sprintf("%s-pod%d", c.Prefix, octet),
		IP:     netip.AddrFrom4(ip),
		IPv6:   netip.AddrFrom16(ip6),
		HostIf: fmt.Sprintf("%sp%d", c.Prefix, octet),
		Node:   node,
	}
	if node.index > 1 {
		p.NS = fmt.Sprintf("%s-n%dpod%d", c.Prefix, node.index, octet)
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

// Addr returns the pod's address of the family of like (IPv6 if like is IPv6).
func (p *Pod) Addr(like netip.Addr) netip.Addr {
	if like.Is6() && !like.Is4In6() {
		return p.IPv6
	}
	return p.IP
}

func (c *Cluster) wirePod(ctx context.Context, p *Pod) error {
	if err := c.addNetns(ctx, p.NS); err != nil {
		return err
	}
	if err := c.sysctl(ctx, p.NS, "net.ipv4.icmp_ratelimit=0", "net.ipv6.icmp.ratelimit=0"); err != nil {
		return err
	}
	if err := c.ip(ctx, p.Node.NS,
		fmt.Sprintf("link add %s type veth peer name eth0 netns %s", p.HostIf, p.NS),
		fmt.Sprintf("addr add %s/32 dev %s", podGateway, p.HostIf),
		fmt.Sprintf("addr add %s/64 dev %s nodad", podGateway6, p.HostIf),
		fmt.Sprintf("link set %s up", p.HostIf),
		fmt.Sprintf("route add %s/32 dev %s", p.IP, p.HostIf),
		fmt.Sprintf("route add %s/128 dev %s", p.IPv6, p.HostIf),
	); err != nil {
		return err
	}
	if err := c.ip(ctx, p.NS,
		fmt.Sprintf("addr add %s/32 dev eth0", p.IP),
		fmt.Sprintf("addr add %s/128 dev eth0 nodad", p.IPv6),
		"link set eth0 up",
		fmt.Sprintf("route add %s dev eth0 scope link", podGateway),
		fmt.Sprintf("route add default via %s dev eth0", podGateway),
		fmt.Sprintf("route add ::/0 via %s dev eth0", podGateway6),
	); err != nil {
		return err
	}
	ports := make([]string, len(EchoPorts))
	for i, port := range EchoPorts {
		ports[i] = strconv.Itoa(port)
	}
	echo, err := c.h.Start("pod-"+p.Name, []string{"POD_NAME=" + p.Name},
		InNetns(p.NS, c.echoBin, "serve", "--ports", strings.Join(ports, ","))...)
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
	Addr     string        // ip:port or [ipv6]:port
	Count    int           // attempts; default 1
	Timeout  time.Duration // per attempt; default 1s
	Interval time.Duration // pause between attempts
	// SourcePort, when not 0, binds every attempt's socket to this local port, so that
	// all attempts share one 5-tuple (one conntrack entry); meant for UDP (a TCP port
	// would be held by TIME_WAIT).
	SourcePort int
	// SourcePortEach: attempt i binds SourcePort+i instead, one 5-tuple per attempt
	// (a set of flows whose ports are known).
	SourcePortEach bool
}

// ProbeResult is the outcome of one attempt.
type ProbeResult struct {
	OK      bool      `json:"ok"`
	Pod     string    `json:"pod"`    // POD_NAME of the server that answered
	Client  string    `json:"client"` // ip:port of the client as seen by the server
	Err     string    `json:"err"`
	Refused bool      `json:"refused"` // ECONNREFUSED (TCP RST or ICMP port unreachable)
	Millis  float64   `json:"ms"`
	At      time.Time `json:"at"` // when the attempt started
}

// Timeout reports whether the attempt got no answer at all (neither an answer nor a
// refusal): what a dropped packet looks like.
func (r ProbeResult) Timeout() bool {
	return !r.OK && !r.Refused && strings.Contains(r.Err, "timeout")
}

func (p *ProbeSpec) args() []string {
	if p.Count <= 0 {
		p.Count = 1
	}
	if p.Timeout <= 0 {
		p.Timeout = time.Second
	}
	args := []string{"probe", "--proto", p.Proto, "--addr", p.Addr,
		"--count", fmt.Sprint(p.Count), "--timeout", p.Timeout.String(), "--interval", p.Interval.String()}
	if p.SourcePort != 0 {
		args = append(args, "--sport", fmt.Sprint(p.SourcePort))
		if p.SourcePortEach {
			args = append(args, "--sport-each")
		}
	}
	return args
}

// Probe runs the echo binary's probe mode inside ns and returns one result per attempt.
func (c *Cluster) Probe(ctx context.Context, ns string, p ProbeSpec) ([]ProbeResult, error) {
	args := p.args()
	bound := time.Duration(p.Count)*(p.Timeout+p.Interval) + 10*time.Second
	ctx, cancel := context.WithTimeout(ctx, bound)
	defer cancel()
	out, err := c.Exec(ctx, ns, append([]string{c.echoBin}, args...)...)
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

// ProbeRun is a probe running in the background (StartProbe); its results can be read
// while it runs.
type ProbeRun struct {
	cmd    *exec.Cmd
	cancel context.CancelFunc
	done   chan struct{}

	mu     sync.Mutex
	res    []ProbeResult
	errs   []string // undecodable output lines
	stderr strings.Builder
}

// StartProbe starts the echo probe in ns in the background, e.g. a steady stream of UDP
// datagrams from a fixed source port. It ends after p.Count attempts, on Stop, or when
// ctx ends (at the latest Count*(Timeout+Interval)+10s after the start).
func (c *Cluster) StartProbe(ctx context.Context, ns string, p ProbeSpec) (*ProbeRun, error) {
	args := p.args()
	bound := time.Duration(p.Count)*(p.Timeout+p.Interval) + 10*time.Second
	ctx, cancel := context.WithTimeout(ctx, bound)
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", ns, c.echoBin}, args...)...)
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		cancel()
		return nil, err
	}
	r := &ProbeRun{cmd: cmd, cancel: cancel, done: make(chan struct{})}
	cmd.Stderr = &lockedWriter{mu: &r.mu, b: &r.stderr}
	if err := cmd.Start(); err != nil {
		cancel()
		return nil, fmt.Errorf("start probe in %s: %w", ns, err)
	}
	go func() {
		defer close(r.done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var res ProbeResult
			err := json.Unmarshal(sc.Bytes(), &res)
			r.mu.Lock()
			if err != nil {
				r.errs = append(r.errs, sc.Text())
			} else {
				r.res = append(r.res, res)
			}
			r.mu.Unlock()
		}
		_ = cmd.Wait()
		cancel()
	}()
	return r, nil
}

// Results returns the results so far.
func (r *ProbeRun) Results() []ProbeResult {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ProbeResult(nil), r.res...)
}

// Done is closed when the probe has exited.
func (r *ProbeRun) Done() <-chan struct{} { return r.done }

// Stop ends the probe (if it still runs) and returns all its results; err reports
// output that was not a result line.
func (r *ProbeRun) Stop() ([]ProbeResult, error) {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	var err error
	if len(r.errs) > 0 {
		err = fmt.Errorf("probe: undecodable output %q; stderr %q", r.errs, r.stderr.String())
	}
	return append([]ProbeResult(nil), r.res...), err
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// HTTPGet sends GET url from inside namespace ns (the socket is created there; no
// process is started) and returns the status code and body.
func (c *Cluster) HTTPGet(ctx context.Context, ns, url string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{DialContext: NSDialer(ns), DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, body, err
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
