package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/e2e/cluster"
)

const (
	benchNS     = "bench"
	servicePort = 80
	targetPort  = 8080
	// firstIPOffset: service i gets ClusterIP 10.96.0.0 + firstIPOffset + i (explicit,
	// so no read-back is needed); extraBase+k are the services the measurements add.
	firstIPOffset = 1024
	extraBase     = 60000
	triggerAnnot  = "endpoints.kubernetes.io/last-change-trigger-time"
)

// api writes the bench's objects with a fast client (high QPS, many workers).
type api struct {
	cs      kubernetes.Interface
	base    netip.Addr // service CIDR base
	backend []netip.Addr
}

func newAPI(c *cluster.Cluster, backends []*cluster.Pod) (*api, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = 2000, 4000
	cfg.ContentType = "application/vnd.kubernetes.protobuf" // cheaper for the apiserver than JSON
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	cfg.Timeout = 60 * time.Second
	cfg.Dial = dialIn(c.NodeNS)
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	a := &api{cs: cs, base: c.ServiceCIDR.Addr()}
	for _, p := range backends {
		a.backend = append(a.backend, p.IP)
	}
	return a, nil
}

// dialIn dials from inside a network namespace (a locked thread switched there and back).
func dialIn(nsName string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		type res struct {
			c   net.Conn
			err error
		}
		ch := make(chan res, 1)
		go func() {
			runtime.LockOSThread()
			orig, err := netns.Get()
			if err != nil {
				runtime.UnlockOSThread()
				ch <- res{nil, err}
				return
			}
			defer orig.Close()
			target, err := netns.GetFromName(nsName)
			if err != nil {
				runtime.UnlockOSThread()
				ch <- res{nil, err}
				return
			}
			defer target.Close()
			if err := netns.Set(target); err != nil {
				ch <- res{nil, err} // thread state unknown: leave it locked (discarded)
				return
			}
			var d net.Dialer
			conn, derr := d.DialContext(ctx, network, addr)
			if err := netns.Set(orig); err != nil {
				if conn != nil {
					conn.Close()
				}
				ch <- res{nil, err}
				return
			}
			runtime.UnlockOSThread()
			ch <- res{conn, derr}
		}()
		r := <-ch
		return r.c, r.err
	}
}

func svcName(i int) string { return fmt.Sprintf("svc-%05d", i) }

// clusterIP of service i.
func (a *api) clusterIP(i int) netip.Addr {
	b := a.base.As4()
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v += uint32(firstIPOffset + i)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func (a *api) addr(i int) string {
	return netip.AddrPortFrom(a.clusterIP(i), servicePort).String()
}

// endpoints returns eps endpoint IPs for service i: backends rotated by i, so that the
// endpoint sets differ between services.
func (a *api) endpoints(i, eps int) []netip.Addr {
	n := len(a.backend)
	out := make([]netip.Addr, 0, eps)
	for j := range eps {
		out = append(out, a.backend[(i+j)%n])
	}
	return out
}

func (a *api) ensureNamespace(ctx context.Context) error {
	_, err := a.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: benchNS}}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	return err
}

func (a *api) service(i int) *corev1.Service {
	ip := a.clusterIP(i).String()
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: svcName(i), Namespace: benchNS},
		Spec: corev1.ServiceSpec{
			ClusterIP:  ip,
			ClusterIPs: []string{ip},
			Ports: []corev1.ServicePort{{Name: "http", Protocol: corev1.ProtocolTCP, Port: servicePort,
				TargetPort: intstr.FromInt32(targetPort)}},
		},
	}
}

func endpointList(ips []netip.Addr) []discoveryv1.Endpoint {
	out := make([]discoveryv1.Endpoint, len(ips))
	for k, ip := range ips {
		out[k] = discoveryv1.Endpoint{
			Addresses:  []string{ip.String()},
			Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To("node-1"),
		}
	}
	return out
}

func (a *api) slice(i int, ips []netip.Addr) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{
			Name: svcName(i) + "-bench", Namespace: benchNS,
			Labels: map[string]string{
				discoveryv1.LabelServiceName: svcName(i),
				discoveryv1.LabelManagedBy:   "nftproxy-bench",
			},
			Annotations: map[string]string{triggerAnnot: time.Now().UTC().Format(time.RFC3339Nano)},
		},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   endpointList(ips),
		Ports: []discoveryv1.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(corev1.ProtocolTCP),
			Port: ptr.To(int32(targetPort))}},
	}
}

func (a *api) createSlice(ctx context.Context, i int, ips []netip.Addr) error {
	_, err := a.cs.DiscoveryV1().EndpointSlices(benchNS).Create(ctx, a.slice(i, ips), metav1.CreateOptions{})
	return err
}

func (a *api) createService(ctx context.Context, i int) error {
	_, err := a.cs.CoreV1().Services(benchNS).Create(ctx, a.service(i), metav1.CreateOptions{})
	return err
}

// setEndpoints replaces service i's endpoints (one merge patch of its slice) and sets
// the trigger-time annotation to the time of the write.
func (a *api) setEndpoints(ctx context.Context, i int, ips []netip.Addr) error {
	patch, err := json.Marshal(map[string]any{
		"metadata":  map[string]any{"annotations": map[string]string{triggerAnnot: time.Now().UTC().Format(time.RFC3339Nano)}},
		"endpoints": endpointList(ips),
	})
	if err != nil {
		return err
	}
	_, err = a.cs.DiscoveryV1().EndpointSlices(benchNS).Patch(ctx, svcName(i)+"-bench", types.MergePatchType, patch, metav1.PatchOptions{})
	return err
}

func (a *api) deleteService(ctx context.Context, i int) error {
	err1 := a.cs.CoreV1().Services(benchNS).Delete(ctx, svcName(i), metav1.DeleteOptions{})
	err2 := a.cs.DiscoveryV1().EndpointSlices(benchNS).Delete(ctx, svcName(i)+"-bench", metav1.DeleteOptions{})
	if err1 != nil && !apierrors.IsNotFound(err1) {
		return err1
	}
	if err2 != nil && !apierrors.IsNotFound(err2) {
		return err2
	}
	return nil
}

// parallel runs f(i) for i in [from, to) on workers goroutines; the first error stops it.
func parallel(ctx context.Context, from, to, workers int, f func(ctx context.Context, i int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var next atomic.Int64
	next.Store(int64(from))
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= to {
					return
				}
				if err := f(ctx, i); err != nil {
					once.Do(func() { first = fmt.Errorf("object %d: %w", i, err); cancel() })
					return
				}
			}
		}()
	}
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return first
}

// populate creates services [from, to), each with a slice of eps endpoints.
func (a *api) populate(ctx context.Context, from, to, eps int) error {
	return parallel(ctx, from, to, 32, func(ctx context.Context, i int) error {
		if err := retry(ctx, func() error { return a.createSlice(ctx, i, a.endpoints(i, eps)) }); err != nil {
			return err
		}
		return retry(ctx, func() error { return a.ensureService(ctx, i) })
	})
}

// ensureService creates service i; a create that fails because its ClusterIP is taken
// counts as done when service i already holds that IP (an earlier attempt that timed out
// on a loaded machine went through: the allocator answers before the name check).
func (a *api) ensureService(ctx context.Context, i int) error {
	err := a.createService(ctx, i)
	if err == nil || !apierrors.IsInvalid(err) {
		return err
	}
	got, gerr := a.cs.CoreV1().Services(benchNS).Get(ctx, svcName(i), metav1.GetOptions{})
	if gerr == nil && got.Spec.ClusterIP == a.clusterIP(i).String() {
		return nil
	}
	return err
}

// reshape gives services [from, to) eps endpoints each.
func (a *api) reshape(ctx context.Context, from, to, eps int) error {
	return parallel(ctx, from, to, 32, func(ctx context.Context, i int) error {
		return retry(ctx, func() error { return a.setEndpoints(ctx, i, a.endpoints(i, eps)) })
	})
}

// retry retries transient API errors (timeouts, throttling) a few times; AlreadyExists
// counts as success.
func retry(ctx context.Context, f func() error) error {
	var err error
	for attempt := range 5 {
		err = f()
		if err == nil || apierrors.IsAlreadyExists(err) {
			return nil
		}
		if !(apierrors.IsServerTimeout(err) || apierrors.IsTimeout(err) || apierrors.IsTooManyRequests(err) ||
			apierrors.IsInternalError(err) || apierrors.IsServiceUnavailable(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(attempt+1) * 200 * time.Millisecond):
		}
	}
	return err
}
