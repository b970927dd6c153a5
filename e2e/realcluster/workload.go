package realcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

// WebApp creates Deployment `name` (agnhost netexec, HTTP on 8080, `replicas` pods pinned
// to node) and a NodePort Service `name` (80 -> 8080). It returns the Service once its
// pods are ready.
func (c *Cluster) WebApp(ctx context.Context, ns, name string, replicas int32, node string) (*corev1.Service, error) {
	labels := map[string]string{"app": name}
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: appsv1.DeploymentSpec{
			Replicas: &replicas,
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{
					NodeSelector: map[string]string{"kubernetes.io/hostname": node},
					Containers: []corev1.Container{{
						Name: "netexec", Image: AgnhostImage, ImagePullPolicy: corev1.PullIfNotPresent,
						Args:           []string{"netexec", "--http-port=8080", "--udp-port=8081"},
						ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
					}},
				},
			},
		},
	}
	if _, err := c.Client.AppsV1().Deployments(ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.ServiceSpec{
			Type:     corev1.ServiceTypeNodePort,
			Selector: labels,
			Ports:    []corev1.ServicePort{{Name: "http", Port: 80, TargetPort: intstr.FromInt32(8080), Protocol: corev1.ProtocolTCP}},
		},
	}
	svc, err := c.Client.CoreV1().Services(ns).Create(ctx, svc, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	err = c.h.WaitFor(wctx, "deployment "+name+" ready", nil, func(ctx context.Context) error {
		d, err := c.Client.AppsV1().Deployments(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if d.Status.ReadyReplicas != replicas {
			return fmt.Errorf("%d/%d ready", d.Status.ReadyReplicas, replicas)
		}
		return nil
	})
	return svc, err
}

// ClientPod creates an agnhost netexec pod `name` on node (a client for kubectl exec and
// for netexec's /dial, as upstream's e2e tests use it) and waits until it is ready.
func (c *Cluster) ClientPod(ctx context.Context, ns, name, node string) error {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{
			NodeName: node,
			Containers: []corev1.Container{{Name: "c", Image: AgnhostImage, ImagePullPolicy: corev1.PullIfNotPresent,
				Args:           []string{"netexec", "--http-port=8080"},
				ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{Path: "/healthz", Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
			}},
		},
	}
	if _, err := c.Client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	return c.h.WaitFor(wctx, "pod "+name+" ready", nil, func(ctx context.Context) error {
		p, err := c.Client.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		for _, cond := range p.Status.Conditions {
			if cond.Type == corev1.PodReady && cond.Status == corev1.ConditionTrue {
				return nil
			}
		}
		return fmt.Errorf("phase %s, not ready", p.Status.Phase)
	})
}

// Exec runs a command in a pod's first container (kubectl exec).
func (c *Cluster) Exec(ctx context.Context, ns, pod string, cmd ...string) (string, error) {
	return c.Kubectl(ctx, append([]string{"exec", "-n", ns, pod, "--"}, cmd...)...)
}

// HTTPFrom makes the netexec client pod fetch http://addr/path once (netexec's /dial,
// as upstream's e2e framework does) and returns the answer's body (netexec's /hostname:
// the backend pod's name). The test process reaches the client pod's 8080 from the
// control-plane namespace.
func (c *Cluster) HTTPFrom(ctx context.Context, ns, pod, addr, path string, timeout time.Duration) (string, error) {
	p, err := c.Client.CoreV1().Pods(ns).Get(ctx, pod, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	q := url.Values{"request": {strings.TrimPrefix(path, "/")}, "host": {host}, "port": {port}, "protocol": {"http"}, "tries": {"1"}}
	u := fmt.Sprintf("http://%s/dial?%s", net.JoinHostPort(p.Status.PodIP, "8080"), q.Encode())
	hc := &http.Client{Timeout: timeout + 5*time.Second, Transport: &http.Transport{DialContext: cluster.NSDialer(c.CPNS), DisableKeepAlives: true}}
	resp, err := hc.Get(u)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var r struct {
		Responses []string `json:"responses"`
		Errors    []string `json:"errors"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return "", fmt.Errorf("/dial answer: %w", err)
	}
	if len(r.Responses) == 0 {
		return "", fmt.Errorf("no answer: %v", r.Errors)
	}
	return strings.TrimSpace(r.Responses[0]), nil
}

// ConnectFrom runs `agnhost connect --timeout` from pod: "" when the TCP connection was
// made, else agnhost's verdict (TIMEOUT, REFUSED, ...).
func (c *Cluster) ConnectFrom(ctx context.Context, ns, pod, addr string, timeout time.Duration) string {
	out, err := c.Exec(ctx, ns, pod, "/agnhost", "connect", "--timeout="+timeout.String(), addr)
	if err == nil {
		return ""
	}
	for _, v := range []string{"TIMEOUT", "REFUSED", "UNKNOWN"} {
		if strings.Contains(out, v) {
			return v
		}
	}
	return strings.TrimSpace(out)
}
