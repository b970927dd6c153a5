package realcluster

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const echoImage = "registry.local/nftproxy-e2e/echo:dev"

// probeResult is one line of `echo probe`.
type probeResult struct {
	OK  bool      `json:"ok"`
	Err string    `json:"err"`
	At  time.Time `json:"at"`
}

// TestDisruption measures, with clients connecting every 50 ms to a ClusterIP and a node
// port: a rolling update of the nftproxy DaemonSet to a new image tag and the deletion
// of node-2's nftproxy pod (zero failed connections expected), and a "reboot" of node-2
// (every process killed, nftables flushed, containerd and kubelet started again): the
// time from the proxy process's first log line to services answering, for nftproxy and
// for kube-proxy. Run by `make conformance` (NFTPROXY_CONFORMANCE=1); figures in
// docs/reliability.md.
func TestDisruption(t *testing.T) {
	if os.Getenv("NFTPROXY_CONFORMANCE") != "1" {
		t.Skip("set NFTPROXY_CONFORMANCE=1 (make conformance) to run the disruption measurements")
	}
	proxies := []string{proxyNftproxy, proxyKubeProxy}
	if p := os.Getenv("DISRUPTION_PROXIES"); p != "" {
		proxies = strings.Split(p, ",")
	}
	for _, proxy := range proxies {
		t.Run(proxy, func(t *testing.T) { disruption(t, proxy) })
	}
}

func disruption(t *testing.T, proxy string) {
	Require(t)
	ctx := t.Context()
	dir := t.TempDir()
	tarball, _, err := BuildNftproxyImage(ctx, dir, NftproxyImageRef)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "nftproxy")
	tarball2 := filepath.Join(dir, "nftproxy-e2e-2.tar")
	if err := writeBinaryImage(tarball2, "nftproxy:e2e-2", bin, "/usr/local/bin/nftproxy"); err != nil {
		t.Fatal(err)
	}
	echoBin, err := cluster.BuildBinaries(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	echoTar := filepath.Join(dir, "echo.tar")
	if err := writeBinaryImage(echoTar, echoImage, echoBin, "/echo"); err != nil {
		t.Fatal(err)
	}
	c := StartT(t, Config{Images: map[string]string{NftproxyImageRef: tarball, "nftproxy:e2e-2": tarball2, echoImage: echoTar}})
	if err := c.WaitNodesReady(ctx, 2*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := installProxy(ctx, c, proxy); err != nil {
		t.Fatal(err)
	}
	svc, err := echoBackends(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	clusterIP := svc.Spec.ClusterIP + ":80"
	nodePort := fmt.Sprintf("%s:%d", NodeIP(2), svc.Spec.Ports[0].NodePort)
	dsName := map[string]string{proxyNftproxy: "nftproxy", proxyKubeProxy: "kube-proxy"}[proxy]

	// disrupt runs probes from pods on node-2 to the ClusterIP and node-2's node port
	// while action runs, and reports failed attempts of each.
	disrupt := func(t *testing.T, name string, action func() error) {
		const interval = 50 * time.Millisecond
		count := 600 // 30 s at 50 ms plus answer times
		pods := map[string]string{name + "-cip": clusterIP, name + "-np": nodePort}
		for pod, addr := range pods {
			if err := probePod(ctx, c, pod, addr, count, interval); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second) // probes under way before the disruption
		t0 := time.Now()
		if err := action(); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %s done in %v", proxy, name, time.Since(t0).Round(time.Millisecond))
		for pod, addr := range pods {
			res, err := probeLogs(ctx, c, pod, 5*time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			fails := 0
			var first string
			for _, r := range res {
				if !r.OK {
					fails++
					if first == "" {
						first = r.At.Format("15:04:05.000") + " " + r.Err
					}
				}
			}
			if len(res) == 0 || !res[0].At.Before(t0) || !res[len(res)-1].At.After(time.Now().Add(-time.Minute)) {
				t.Errorf("%s %s: probes do not span the disruption (%d results)", name, addr, len(res))
			}
			msg := fmt.Sprintf("%s: %s: %s: %d attempts every %v, %d failed", proxy, name, addr, len(res), interval, fails)
			if fails > 0 {
				t.Errorf("%s (first: %s)", msg, first)
			} else {
				t.Log(msg)
			}
		}
	}

	if proxy == proxyNftproxy {
		t.Run("rolling-update", func(t *testing.T) {
			disrupt(t, "roll", func() error {
				if _, err := c.Kubectl(ctx, "-n", "kube-system", "set", "image", "daemonset/nftproxy", "nftproxy=nftproxy:e2e-2"); err != nil {
					return err
				}
				return c.WaitDaemonSet(ctx, "kube-system", "nftproxy", 3*time.Minute)
			})
		})
	}
	t.Run("pod-deleted", func(t *testing.T) {
		disrupt(t, "del", func() error {
			pod, err := proxyPodOn(ctx, c, dsName, "node-2")
			if err != nil {
				return err
			}
			if _, err := c.Kubectl(ctx, "-n", "kube-system", "delete", "pod", pod.Name, "--wait=true"); err != nil {
				return err
			}
			return c.WaitDaemonSet(ctx, "kube-system", dsName, 3*time.Minute)
		})
	})
	t.Run("node-reboot", func(t *testing.T) {
		n := c.Nodes[1]
		before, err := proxyPodOn(ctx, c, dsName, "node-2")
		if err != nil {
			t.Fatal(err)
		}
		restarts := int32(0)
		if len(before.Status.ContainerStatuses) > 0 {
			restarts = before.Status.ContainerStatuses[0].RestartCount
		}
		// Host-network client in node-2 (its ClusterIP path) and an external client in the
		// control-plane namespace (node-2's node port): both need node-2's rules.
		const count = 1800 // 90 s at 50 ms (timeouts of 250 ms make it longer while down)
		pctx, cancel := context.WithCancel(ctx)
		var wg sync.WaitGroup
		defer wg.Wait()
		defer cancel()
		type probeOut struct {
			res []probeResult
			err error
		}
		results := map[string]*probeOut{}
		for name, p := range map[string][2]string{"clusterip-from-node-2": {n.NS, clusterIP}, "nodeport-of-node-2": {c.CPNS, nodePort}} {
			o := &probeOut{}
			results[name] = o
			wg.Add(1)
			go func() {
				defer wg.Done()
				o.res, o.err = netnsProbe(pctx, echoBin, p[0], p[1], count)
			}()
		}
		time.Sleep(2 * time.Second)
		t0 := time.Now()
		if err := n.Reboot(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: node-2 rebooted (processes killed, ruleset flushed, containerd and kubelet started) in %v", proxy, time.Since(t0).Round(time.Millisecond))
		// The proxy's container on node-2 started again (a new attempt) and is ready.
		var started time.Time
		var after *corev1.Pod
		wctx, wcancel := context.WithTimeout(ctx, 3*time.Minute)
		defer wcancel()
		if err := c.h.WaitFor(wctx, dsName+" restarted on node-2", nil, func(ctx context.Context) error {
			p, err := proxyPodOn(ctx, c, dsName, "node-2")
			if err != nil {
				return err
			}
			cs := p.Status.ContainerStatuses
			if len(cs) == 0 || (p.UID == before.UID && cs[0].RestartCount <= restarts) || !cs[0].Ready {
				return fmt.Errorf("not restarted and ready yet")
			}
			after = p
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := c.h.WaitFor(wctx, dsName+" log on node-2", nil, func(ctx context.Context) error {
			var err error
			started, err = firstLogTime(ctx, c, after.Name)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		for name, o := range results {
			if o.err != nil {
				t.Errorf("%s: %v", name, o.err)
				continue
			}
			var back, downSince time.Time
			for _, r := range o.res {
				if !r.OK && downSince.IsZero() && r.At.After(t0.Add(-time.Second)) {
					downSince = r.At
				}
				if r.OK && !downSince.IsZero() && r.At.After(started) {
					back = r.At
					break
				}
			}
			if back.IsZero() {
				t.Errorf("%s: %s: services never answered again after the reboot (%d attempts)", proxy, name, len(o.res))
				continue
			}
			t.Logf("%s: node-reboot: %s: down from %s, %s process started %s, answering again %s: %v after the proxy started, %v after the reboot",
				proxy, name, downSince.Format("15:04:05.000"), proxy, started.Format("15:04:05.000"), back.Format("15:04:05.000"),
				back.Sub(started).Round(time.Millisecond), back.Sub(t0).Round(time.Millisecond))
		}
	})
}

// echoBackends creates Deployment + NodePort Service "web": two `echo serve` pods on
// node-1 (TCP 8080), port 80.
func echoBackends(ctx context.Context, c *Cluster) (*corev1.Service, error) {
	labels := map[string]string{"app": "web"}
	replicas := int32(2)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": "node-1"},
					Containers: []corev1.Container{{
						Name: "echo", Image: echoImage, ImagePullPolicy: corev1.PullNever,
						Args:           []string{"serve", "--ports", "8080"},
						Env:            []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments("default").Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	svc, err := c.Client.CoreV1().Services("default").Create(ctx, &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: "web", Namespace: "default"},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeNodePort, Selector: labels,
			Ports: []corev1.ServicePort{{Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}}},
	}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return svc, c.h.WaitFor(wctx, "web backends ready", nil, func(ctx context.Context) error {
		d, err := c.Client.AppsV1().Deployments("default").Get(ctx, "web", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != replicas {
			return fmt.Errorf("%d ready", d.Status.ReadyReplicas)
		}
		return nil
	})
}

// probePod starts pod `name` on node-2 running `echo probe` against addr (count attempts,
// interval apart, 1 s timeout each) and waits until it runs.
func probePod(ctx context.Context, c *Cluster, name, addr string, count int, interval time.Duration) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"},
		Spec: corev1.PodSpec{
			NodeName:      "node-2",
			RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "probe", Image: echoImage, ImagePullPolicy: corev1.PullNever,
				Args: []string{"probe", "--proto", "tcp", "--addr", addr, "--count", fmt.Sprint(count),
					"--interval", interval.String(), "--timeout", "1s"}}},
		},
	}
	if _, err := c.Client.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	return c.h.WaitFor(wctx, "probe pod "+name+" running", nil, func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodRunning {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	})
}

// probeLogs waits for the probe pod to finish and parses its output.
func probeLogs(ctx context.Context, c *Cluster, name string, timeout time.Duration) ([]probeResult, error) {
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if err := c.h.WaitFor(wctx, "probe pod "+name+" done", nil, func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods("default").Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			return fmt.Errorf("phase %s", p.Status.Phase)
		}
		return nil
	}); err != nil {
		return nil, err
	}
	out, err := c.Kubectl(ctx, "logs", "-n", "default", name)
	if err != nil {
		return nil, err
	}
	return parseProbe(out), nil
}

func parseProbe(out string) []probeResult {
	var res []probeResult
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r probeResult
		if json.Unmarshal(sc.Bytes(), &r) == nil && !r.At.IsZero() {
			res = append(res, r)
		}
	}
	return res
}

// netnsProbe runs `echo probe` (250 ms timeout, 50 ms apart) in a harness netns.
func netnsProbe(ctx context.Context, echoBin, ns, addr string, count int) ([]probeResult, error) {
	argv := cluster.InNetns(ns, echoBin, "probe", "--proto", "tcp", "--addr", addr, "--count", fmt.Sprint(count),
		"--interval", "50ms", "--timeout", "250ms")
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("echo probe in %s: %w", ns, err)
	}
	return parseProbe(string(out)), nil
}

// proxyPodOn is the DaemonSet's running pod on node.
func proxyPodOn(ctx context.Context, c *Cluster, ds, node string) (*corev1.Pod, error) {
	label := map[string]string{"nftproxy": "k8s-app=nftproxy", "kube-proxy": "k8s-app=kube-proxy"}[ds]
	pods, err := c.Client.CoreV1().Pods("kube-system").List(ctx, metav1.ListOptions{LabelSelector: label, FieldSelector: "spec.nodeName=" + node})
	if err != nil {
		return nil, err
	}
	for i := range pods.Items {
		if pods.Items[i].DeletionTimestamp == nil && pods.Items[i].Status.Phase == corev1.PodRunning {
			return &pods.Items[i], nil
		}
	}
	return nil, fmt.Errorf("no running %s pod on %s", ds, node)
}

// firstLogTime is the time the runtime recorded for the pod's first log line (`kubectl
// logs --timestamps`): the proxy process's start, whatever its log format.
func firstLogTime(ctx context.Context, c *Cluster, pod string) (time.Time, error) {
	out, err := c.Kubectl(ctx, "logs", "--timestamps", "--limit-bytes=2048", "-n", "kube-system", pod)
	if err != nil {
		return time.Time{}, err
	}
	first, _, _ := strings.Cut(out, " ")
	ts, err := time.Parse(time.RFC3339Nano, first)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s's log: %w:\n%s", pod, err, lastLines(out, 5))
	}
	return ts, nil
}
