package realcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const cniBinDir = "/usr/lib/cni"

// Node is one kubelet node: a network namespace on the LAN, and a private mount
// namespace (held by a sleeping "holder" process that entered the node netns) in which
// containerd and the kubelet run; its tmpfs mounts over /run/netns, /run/containerd and
// /var/lib/cni keep pod netns files, shim sockets and CNI state away from the host and
// from the other nodes.
type Node struct {
	Index      int
	Name       string // node-N
	NS         string // its network namespace
	IP         string
	PodCIDR    string
	Dir        string // WorkDir/node-N: configs, containerd root, kubelet root, logs
	Socket     string // containerd's CRI socket
	CgroupRoot string // the kubelet's cgroupRoot, in every cgroup v1 hierarchy

	c                           *Cluster
	holder, containerd, kubelet *cluster.Process
	boots                       int
}

func (c *Cluster) addNode(ctx context.Context, i int) (*Node, error) {
	n := &Node{
		Index: i, Name: fmt.Sprintf("node-%d", i), NS: fmt.Sprintf("%s-n%d", c.Prefix, i),
		IP: NodeIP(i), PodCIDR: nodePodCIDR(i), Dir: filepath.Join(c.WorkDir, fmt.Sprintf("node-%d", i)),
		CgroupRoot: fmt.Sprintf("/%s-node-%d", c.Prefix, i), c: c,
	}
	n.Socket = filepath.Join(n.Dir, "containerd.sock")
	c.mu.Lock()
	c.Nodes = append(c.Nodes, n) // so Stop tears it down even if setup fails half-way
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		c.Nodes = c.Nodes[:len(c.Nodes)-1] // Start appends it again on success
		c.mu.Unlock()
	}()
	if err := os.MkdirAll(n.Dir, 0o755); err != nil {
		return nil, err
	}
	if err := c.addNetns(ctx, n.NS); err != nil {
		return nil, err
	}
	veth := fmt.Sprintf("%sn%d", c.Prefix, i)
	if _, err := run(ctx, "ip", "-n", c.CPNS, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", n.NS); err != nil {
		return nil, err
	}
	if err := c.ip(ctx, c.CPNS, "link set "+veth+" master br0 up",
		fmt.Sprintf("route add %s via %s", n.PodCIDR, n.IP)); err != nil {
		return nil, err
	}
	cmds := []string{
		fmt.Sprintf("addr add %s/%d dev eth0", n.IP, lanPrefix), "link set eth0 up",
		"route add default via " + APIAddr,
	}
	for j := 1; j <= 9; j++ { // the other nodes' pod CIDRs, over the LAN
		if j != i {
			cmds = append(cmds, fmt.Sprintf("route add %s via %s", nodePodCIDR(j), NodeIP(j)))
		}
	}
	if err := c.ip(ctx, n.NS, cmds...); err != nil {
		return nil, err
	}
	// A router for its pods; bridged pod-to-pod traffic goes through netfilter (as on a
	// node with br_netfilter), so a service answer from a pod on the same bridge is un-NATed.
	if _, err := run(ctx, cluster.InNetns(n.NS, "sysctl", "-qw", "net.ipv4.ip_forward=1", "net.bridge.bridge-nf-call-iptables=1")...); err != nil {
		return nil, err
	}
	if err := n.writeConfigs(); err != nil {
		return nil, err
	}
	if err := n.makeCgroups(); err != nil {
		return nil, err
	}
	if err := n.boot(ctx); err != nil {
		return nil, err
	}
	return n, nil
}

func (n *Node) writeConfigs() error {
	c := n.c
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "realcluster",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "/var/lib/cni/networks",
              "ranges": [[{"subnet": %q, "gateway": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, n.PodCIDR, nodePodGateway(n.Index))
	containerd := fmt.Sprintf(`version = 2
root = %q
state = "/run/containerd/state"
[grpc]
  address = %q
[ttrpc]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = %q
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = %q
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = %q
    conf_dir = %q
`, filepath.Join(n.Dir, "containerd"), n.Socket, filepath.Join(n.Dir, "opt"), PauseImage, cniBinDir, filepath.Join(n.Dir, "cni"))
	kubelet := fmt.Sprintf(`apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: %s
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
cgroupDriver: cgroupfs
cgroupRoot: %s
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://%s
podLogsDir: %s
authentication:
  anonymous:
    enabled: true
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
clusterDNS: [%s]
clusterDomain: cluster.local
resolvConf: %s
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: "1%%"
  imagefs.available: "1%%"
  nodefs.inodesFree: "1%%"
protectKernelDefaults: false
rotateCertificates: false
serverTLSBootstrap: false
`, n.IP, n.CgroupRoot, n.Socket, filepath.Join(n.Dir, "pod-logs"), DNSServiceIP, filepath.Join(n.Dir, "resolv.conf"))
	files := map[string]string{
		"cni/10-realcluster.conflist": cni,
		"containerd.toml":             containerd,
		"kubelet.yaml":                kubelet,
		"resolv.conf":                 "",
	}
	for name, body := range files {
		p := filepath.Join(n.Dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filepath.Join(n.Dir, "pod-logs"), 0o755); err != nil {
		return err
	}
	return c.writeKubeconfig(filepath.Join(n.Dir, "kubelet.kubeconfig"), "system:node:"+n.Name, nodeToken(c.adminToken, n.Index))
}

// cgroupHierarchies are the mounted cgroup v1 hierarchies (/sys/fs/cgroup/<name>).
func cgroupHierarchies() []string {
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		p := filepath.Join("/sys/fs/cgroup", e.Name())
		if fi, err := os.Lstat(p); err == nil && fi.IsDir() && fi.Mode()&os.ModeSymlink == 0 {
			if _, err := os.Stat(filepath.Join(p, "cgroup.procs")); err == nil {
				out = append(out, p)
			}
		}
	}
	return out
}

// makeCgroups creates the node's cgroupRoot in every hierarchy (the kubelet requires it
// to exist); cpuset needs its cpus and mems copied from the parent before use.
func (n *Node) makeCgroups() error {
	for _, h := range cgroupHierarchies() {
		d := filepath.Join(h, n.CgroupRoot)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
		if filepath.Base(h) == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(h, f))
				if err != nil {
					return err
				}
				if err := os.WriteFile(filepath.Join(d, f), b, 0o644); err != nil {
					return fmt.Errorf("%s: %w", filepath.Join(d, f), err)
				}
			}
		}
	}
	return nil
}

// boot starts the holder (private mount namespace in the node netns), containerd,
// imports the images, and starts the kubelet.
func (n *Node) boot(ctx context.Context) error {
	c := n.c
	n.boots++
	script := "set -e; mkdir -p /run/netns /run/containerd /var/lib/cni; " +
		"mount -t tmpfs tmpfs /run/netns; mount -t tmpfs tmpfs /run/containerd; mount -t tmpfs tmpfs /var/lib/cni; " +
		"exec sleep 2147483647"
	var err error
	n.holder, err = c.h.Start(n.Name+"-holder", nil, []string{"unshare", "-m", "--propagation", "private", "--",
		"nsenter", "--net=/run/netns/" + n.NS, "--", "sh", "-c", script}...)
	if err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := c.h.WaitFor(wctx, n.Name+" mount namespace", []*cluster.Process{n.holder}, func(context.Context) error {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", n.holder.PID()))
		if err != nil || strings.TrimSpace(string(b)) != "sleep" {
			return fmt.Errorf("holder not ready (%q)", b)
		}
		return nil
	}); err != nil {
		return err
	}
	enter := []string{"nsenter", "-t", strconv.Itoa(n.holder.PID()), "-m", "-n", "--"}
	_ = os.Remove(n.Socket)
	n.containerd, err = c.h.Start(n.Name+"-containerd", nil, append(enter, "containerd", "--config", filepath.Join(n.Dir, "containerd.toml"))...)
	if err != nil {
		return err
	}
	cctx, cancel2 := context.WithTimeout(ctx, 60*time.Second)
	defer cancel2()
	if err := c.h.WaitFor(cctx, n.Name+" containerd", []*cluster.Process{n.containerd}, func(ctx context.Context) error {
		_, err := run(ctx, "ctr", "--address", n.Socket, "version")
		return err
	}); err != nil {
		return err
	}
	// The CRI plugin initialises after containerd says it booted; a kubelet started
	// before that exits ("server is not initialized yet"). Its last step is logged.
	if err := c.h.WaitFor(cctx, n.Name+" CRI ready", []*cluster.Process{n.containerd}, func(context.Context) error {
		b, err := os.ReadFile(n.containerd.Log)
		if err != nil {
			return err
		}
		if got := strings.Count(string(b), `msg="Start streaming server"`); got < n.boots {
			return fmt.Errorf("CRI not initialised yet")
		}
		return nil
	}); err != nil {
		return err
	}
	if n.boots == 1 {
		t0 := time.Now()
		refs := make([]string, 0, len(c.images))
		for ref := range c.images {
			refs = append(refs, ref)
		}
		sort.Strings(refs)
		for _, ref := range refs {
			if _, err := run(ctx, "ctr", "--address", n.Socket, "-n", "k8s.io", "images", "import", c.images[ref]); err != nil {
				return fmt.Errorf("import %s: %w", ref, err)
			}
		}
		c.h.Logf("%s: %d images imported in %v", n.Name, len(refs), time.Since(t0).Round(time.Millisecond))
	}
	n.kubelet, err = c.h.Start(n.Name+"-kubelet", nil, append(enter, c.Bins.Kubelet,
		"--config="+filepath.Join(n.Dir, "kubelet.yaml"),
		"--kubeconfig="+filepath.Join(n.Dir, "kubelet.kubeconfig"),
		"--root-dir="+filepath.Join(n.Dir, "kubelet"),
		"--cert-dir="+filepath.Join(n.Dir, "kubelet-pki"),
		"--hostname-override="+n.Name,
		"--node-ip="+n.IP,
		"--v=2",
	)...)
	return err
}

// ImportImage imports an OCI tarball into the node's containerd (e.g. a new nftproxy tag).
func (n *Node) ImportImage(ctx context.Context, tarball string) error {
	_, err := run(ctx, "ctr", "--address", n.Socket, "-n", "k8s.io", "images", "import", tarball)
	return err
}

func (c *Cluster) waitNodeRegistered(ctx context.Context, n *Node) error {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if err := c.h.WaitFor(wctx, n.Name+" registered", []*cluster.Process{n.kubelet, n.containerd}, func(ctx context.Context) error {
		_, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
		return err
	}); err != nil {
		return err
	}
	// Node IPAM is off: set the pod CIDR the node's CNI configuration uses.
	patch := fmt.Sprintf(`{"spec":{"podCIDR":%q,"podCIDRs":[%q]}}`, n.PodCIDR, n.PodCIDR)
	node, err := c.Client.CoreV1().Nodes().Get(ctx, n.Name, metav1.GetOptions{})
	if err != nil {
		return err
	}
	if node.Spec.PodCIDR == "" {
		if _, err := c.Client.CoreV1().Nodes().Patch(ctx, n.Name, types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			return fmt.Errorf("set %s podCIDR: %w", n.Name, err)
		}
	}
	return nil
}

// WaitNodesReady waits until every node reports Ready.
func (c *Cluster) WaitNodesReady(ctx context.Context, timeout time.Duration) error {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return c.h.WaitFor(wctx, "nodes Ready", nil, func(ctx context.Context) error {
		nodes, err := c.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{})
		if err != nil {
			return err
		}
		if len(nodes.Items) != len(c.Nodes) {
			return fmt.Errorf("%d nodes, want %d", len(nodes.Items), len(c.Nodes))
		}
		for _, nd := range nodes.Items {
			ready := false
			for _, cond := range nd.Status.Conditions {
				if cond.Type == corev1.NodeReady && cond.Status == corev1.ConditionTrue {
					ready = true
				}
			}
			if !ready {
				return fmt.Errorf("%s not Ready", nd.Name)
			}
		}
		return nil
	})
}

// Reboot simulates a node reboot: every process of the node (kubelet, containerd, shims,
// containers) is killed, its mount namespace (pod netns files, tmpfs state) goes, its
// nftables ruleset is flushed; then containerd and the kubelet start again (the on-disk
// containerd root, images and kubelet root survive, as on a real disk).
func (n *Node) Reboot(ctx context.Context) error {
	if err := n.killAll(); err != nil {
		return err
	}
	if _, err := run(ctx, cluster.InNetns(n.NS, "nft", "flush", "ruleset")...); err != nil {
		return err
	}
	return n.boot(ctx)
}

// killAll kills the node's whole process tree: kubelet and containerd first (SIGTERM,
// then SIGKILL), then every process in the node's mount namespace (shims, the holder) and
// all their descendants (containers, which have mount namespaces of their own).
func (n *Node) killAll() error {
	if n.kubelet != nil {
		n.kubelet.Stop()
	}
	if n.containerd != nil {
		n.containerd.Stop()
	}
	if n.holder == nil {
		return nil
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		var alive []int
		for _, p := range processTree(append(pidsInMountNS(n.holder.PID()), n.holder.PID())...) {
			if p != os.Getpid() && !zombie(p) && syscall.Kill(p, syscall.SIGKILL) == nil {
				alive = append(alive, p)
			}
		}
		if len(alive) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: processes still alive after SIGKILL: %v", n.Name, alive)
		}
		time.Sleep(200 * time.Millisecond)
	}
	n.holder.Kill() // already SIGKILLed: waits for it to be reaped
	return nil
}

// teardown kills everything of the node and removes its cgroups.
func (n *Node) teardown() error {
	err := n.killAll()
	return errors.Join(err, n.removeCgroups())
}

func (n *Node) removeCgroups() error {
	var errs []error
	for _, h := range cgroupHierarchies() {
		root := filepath.Join(h, n.CgroupRoot)
		if _, err := os.Stat(root); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		// Deepest first; a cgroup whose last task just died may need a moment.
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for try := 0; try < 20; try++ {
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("rmdir %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func zombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true // gone
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || len(s) < i+3 || s[i+2] == 'Z'
}
