package source

import (
	"fmt"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"
	"unsafe"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft"
)

// filler sets every exported field of a value, recursively, to a distinct non-zero
// value: slices and maps get two elements, pointers a filled value. Fields upstream
// adds later are filled too, so a test comparing a slimmed object with what it should
// keep notices them.
type filler struct{ n int }

var timeType = reflect.TypeFor[metav1.Time]()

func (f *filler) fill(v reflect.Value) {
	f.n++
	switch v.Kind() {
	case reflect.String:
		v.SetString(fmt.Sprintf("s%d", f.n))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(f.n % 100))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(f.n % 100))
	case reflect.Pointer:
		p := reflect.New(v.Type().Elem())
		f.fill(p.Elem())
		v.Set(p)
	case reflect.Slice:
		s := reflect.MakeSlice(v.Type(), 2, 2)
		for i := range 2 {
			f.fill(s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		m := reflect.MakeMap(v.Type())
		for range 2 {
			k, e := reflect.New(v.Type().Key()).Elem(), reflect.New(v.Type().Elem()).Elem()
			f.fill(k)
			f.fill(e)
			m.SetMapIndex(k, e)
		}
		v.Set(m)
	case reflect.Struct:
		if v.Type() == timeType {
			v.Set(reflect.ValueOf(metav1.NewTime(time.Date(2026, 1, 2, 3, 4, f.n%60, 0, time.UTC))))
			return
		}
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				f.fill(v.Field(i))
			}
		}
	}
}

func filled[T any]() *T {
	var x T
	(&filler{}).fill(reflect.ValueOf(&x).Elem())
	return &x
}

// dropMeta clears what slim drops of any object's metadata.
func dropMeta(m *metav1.ObjectMeta) {
	m.GenerateName = ""
	m.SetSelfLink("")
	m.Labels, m.Annotations, m.OwnerReferences, m.Finalizers, m.ManagedFields = nil, nil, nil, nil, nil
}

// wantService is svc with what slim drops cleared: the list of slim's comment, written
// out separately.
func wantService(svc *v1.Service) *v1.Service {
	w := svc.DeepCopy()
	balancing, hasBalancing := w.Annotations[model.LoadBalancingAnnotation]
	dropMeta(&w.ObjectMeta)
	if hasBalancing {
		w.Annotations = map[string]string{model.LoadBalancingAnnotation: balancing}
	}
	s := &w.Spec
	s.Selector, s.IPFamilies, s.IPFamilyPolicy, s.TrafficDistribution = nil, nil, nil, nil
	s.ExternalName, s.LoadBalancerIP, s.LoadBalancerClass, s.AllocateLoadBalancerNodePorts = "", "", nil, nil
	s.PublishNotReadyAddresses = false
	for i := range s.Ports {
		s.Ports[i].TargetPort, s.Ports[i].AppProtocol = intstr.IntOrString{}, nil
	}
	w.Status.Conditions = nil
	for i := range w.Status.LoadBalancer.Ingress {
		g := &w.Status.LoadBalancer.Ingress[i]
		g.Hostname, g.Ports = "", nil
	}
	return w
}

// wantSlice is s with what slim drops cleared; timed: its trigger time is kept.
func wantSlice(s *discovery.EndpointSlice, timed bool) *discovery.EndpointSlice {
	w := s.DeepCopy()
	svc, hasSvc := w.Labels[discovery.LabelServiceName]
	trigger, hasTrigger := w.Annotations[TriggerTimeAnnotation]
	dropMeta(&w.ObjectMeta)
	if hasSvc {
		w.Labels = map[string]string{discovery.LabelServiceName: svc}
	}
	if hasTrigger && timed {
		w.Annotations = map[string]string{TriggerTimeAnnotation: trigger}
	}
	for i := range w.Endpoints {
		e := &w.Endpoints[i]
		e.TargetRef, e.Hostname, e.DeprecatedTopology = nil, nil, nil
	}
	return w
}

func always(*discovery.EndpointSlice) bool { return true }

// checkSlim slims a copy of each object (twice: client-go may transform an object again)
// and compares it with what it should keep.
func checkSlim(t *testing.T, svc *v1.Service, s *discovery.EndpointSlice) {
	t.Helper()
	for range 2 {
		want := wantService(svc)
		got := svc.DeepCopy()
		for range 2 {
			got = slim(got, always).(*v1.Service)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("slimmed Service:\n%+v\nwant\n%+v", got, want)
			}
		}
		wantS := wantSlice(s, true)
		gotS := s.DeepCopy()
		for range 2 {
			gotS = slim(gotS, always).(*discovery.EndpointSlice)
			if !reflect.DeepEqual(gotS, wantS) {
				t.Errorf("slimmed EndpointSlice:\n%+v\nwant\n%+v", gotS, wantS)
			}
		}
		// endpoints in an exact-sized array (DeepCopy's, and the streamed lists') are
		// rewritten in it; in one with room to spare, copied into an exact-sized one
		exact := s.DeepCopy()
		if eps := exact.Endpoints; len(eps) > 0 && &slim(exact, always).(*discovery.EndpointSlice).Endpoints[0] != &eps[0] {
			t.Errorf("the endpoints of an exact-sized array were copied")
		}
		spare := s.DeepCopy()
		spare.Endpoints = append(make([]discovery.Endpoint, 0, len(spare.Endpoints)+3), spare.Endpoints...)
		if got := slim(spare, always).(*discovery.EndpointSlice); !reflect.DeepEqual(got, wantS) || len(got.Endpoints) != cap(got.Endpoints) {
			t.Errorf("slimmed EndpointSlice whose endpoints array has room to spare:\n%+v\nwant\n%+v", got, wantS)
		}
		if got := slim(s.DeepCopy(), nil).(*discovery.EndpointSlice); !reflect.DeepEqual(got, wantSlice(s, false)) {
			t.Errorf("slimmed EndpointSlice without its trigger time:\n%+v\nwant\n%+v", got, wantSlice(s, false))
		}
		// and with the service name label alone, kept as it is
		s = s.DeepCopy()
		s.Labels = map[string]string{discovery.LabelServiceName: "web"}
	}
}

// Every field set: the slimmed object is the original without what slim drops. A field
// upstream adds is dropped and fails this test until slim's comment and wantService or
// wantSlice say what becomes of it.
func TestSlimKeepsWhatIsRead(t *testing.T) {
	for seed := range 3 {
		svc := filled[v1.Service]()
		s := filled[discovery.EndpointSlice]()
		s.Labels[discovery.LabelServiceName] = "web"
		s.Annotations[TriggerTimeAnnotation] = "2026-01-01T00:00:00Z"
		if seed > 0 { // well-known values, which slim shares
			svc.Spec.Type, svc.Spec.SessionAffinity = v1.ServiceTypeLoadBalancer, v1.ServiceAffinityClientIP
			svc.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
			svc.Spec.Ports[0].Protocol, svc.Spec.Ports[1].Name = v1.ProtocolUDP, "http"
			svc.Status.LoadBalancer.Ingress[0].IPMode = ptr.To(v1.LoadBalancerIPModeProxy)
			svc.Status.LoadBalancer.Ingress[1].IPMode = ptr.To(v1.LoadBalancerIPModeVIP)
			svc.Spec.ClusterIPs[0] = svc.Spec.ClusterIP
			s.Ports[0].Protocol = ptr.To(v1.ProtocolSCTP)
		}
		if seed == 2 { // nil and empty, which slim keeps apart
			svc.Spec.Ports, svc.Spec.ExternalIPs, svc.Spec.InternalTrafficPolicy = []v1.ServicePort{}, nil, nil
			svc.Status.LoadBalancer.Ingress = nil
			s.Endpoints = append(s.Endpoints, discovery.Endpoint{}, discovery.Endpoint{Addresses: []string{},
				Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{}}})
			s.Ports = append(s.Ports, discovery.EndpointPort{})
		}
		conds := []*bool{nil, ptr.To(true), ptr.To(false)}
		for i := range s.Endpoints {
			c := &s.Endpoints[i].Conditions
			c.Ready, c.Serving, c.Terminating = conds[i%3], conds[(i+1)%3], conds[(i+2)%3]
		}
		checkSlim(t, svc, s)
	}
}

// sliceOf returns a slice of service svc with the given endpoints.
func sliceOf(svc, name string, family discovery.AddressType, eps ...discovery.Endpoint) *discovery.EndpointSlice {
	return &discovery.EndpointSlice{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u-" + name), ResourceVersion: "7",
			GenerateName:    svc + "-",
			Labels:          map[string]string{discovery.LabelServiceName: svc, discovery.LabelManagedBy: "endpointslice-controller.k8s.io", "app": svc},
			Annotations:     map[string]string{TriggerTimeAnnotation: "2026-01-01T00:00:00Z"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc, UID: "svc-uid"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "kube-controller-manager"}}},
		AddressType: family,
		Ports: []discovery.EndpointPort{
			{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP), Port: ptr.To(int32(8080)), AppProtocol: ptr.To("http")},
			{Name: ptr.To("dns"), Protocol: ptr.To(v1.ProtocolUDP), Port: ptr.To(int32(53))},
		},
		Endpoints: eps,
	}
}

// endpointsOf returns endpoints at the addresses, on nodes n0..n2 in zones a and b,
// with conditions nil, true and false in turn, hints and the fields slim drops.
func endpointsOf(addrs ...string) []discovery.Endpoint {
	conds := []*bool{nil, ptr.To(true), ptr.To(false)}
	var out []discovery.Endpoint
	for i, a := range addrs {
		node, zone := fmt.Sprintf("node-%d", i%3), fmt.Sprintf("zone-%c", 'a'+i%2)
		out = append(out, discovery.Endpoint{
			Addresses:  []string{a, a},
			Conditions: discovery.EndpointConditions{Ready: conds[i%3], Serving: conds[(i+i/3)%3], Terminating: conds[(i+2)%3]},
			NodeName:   ptr.To(node), Zone: ptr.To(zone), Hostname: ptr.To("pod"),
			TargetRef: &v1.ObjectReference{Kind: "Pod", Name: fmt.Sprintf("pod-%d", i)},
			Hints: &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: zone}},
				ForNodes: []discovery.ForNode{{Name: node}}},
			DeprecatedTopology: map[string]string{"kubernetes.io/hostname": node},
		})
	}
	return out
}

// modelInput is Services and slices of every kind, with every field the proxy ignores
// set, and this node's Node (node-1 in zone-b).
func modelInput() ([]*v1.Service, []*discovery.EndpointSlice, *v1.Node) {
	svc := func(name, typ string, ips ...string) *v1.Service {
		s := &v1.Service{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: name, UID: types.UID("u-" + name), ResourceVersion: "3",
				CreationTimestamp: metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
				Labels:            map[string]string{"app": name, "tier": "web", "team": "a", "env": "prod", "chart": "x"},
				Annotations:       map[string]string{"note": "x"}, ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubectl"}}},
			Spec: v1.ServiceSpec{
				Type: v1.ServiceType(typ), ClusterIP: ips[0], ClusterIPs: ips,
				Selector: map[string]string{"app": name, "tier": "web", "team": "a"},
				Ports: []v1.ServicePort{
					{Name: "http", Protocol: v1.ProtocolTCP, Port: 80, TargetPort: intstr.FromString("http"), AppProtocol: ptr.To("http")},
					{Name: "dns", Protocol: v1.ProtocolUDP, Port: 53, TargetPort: intstr.FromInt32(53)},
				},
				IPFamilies:          []v1.IPFamily{v1.IPv4Protocol, v1.IPv6Protocol},
				IPFamilyPolicy:      ptr.To(v1.IPFamilyPolicyPreferDualStack),
				TrafficDistribution: ptr.To(v1.ServiceTrafficDistributionPreferClose),
				SessionAffinity:     v1.ServiceAffinityNone,
			},
		}
		if typ != "ClusterIP" {
			s.Spec.Ports[0].NodePort, s.Spec.Ports[1].NodePort = 30080, 30053
			s.Spec.ExternalIPs = []string{"192.0.2.10", "2001:db8::10"}
		}
		return s
	}
	plain := svc("plain", "ClusterIP", "10.96.0.1", "fd00::1")
	local := svc("local", "NodePort", "10.96.0.2")
	local.Spec.ExternalTrafficPolicy = v1.ServiceExternalTrafficPolicyLocal
	local.Spec.InternalTrafficPolicy = ptr.To(v1.ServiceInternalTrafficPolicyLocal)
	local.Annotations[model.LoadBalancingAnnotation] = "maglev"
	lb := svc("lb", "LoadBalancer", "10.96.0.3", "fd00::3")
	lb.Spec.ExternalTrafficPolicy, lb.Spec.HealthCheckNodePort = v1.ServiceExternalTrafficPolicyLocal, 32000
	lb.Spec.SessionAffinity = v1.ServiceAffinityClientIP
	lb.Spec.SessionAffinityConfig = &v1.SessionAffinityConfig{ClientIP: &v1.ClientIPConfig{TimeoutSeconds: ptr.To(int32(600))}}
	lb.Spec.LoadBalancerSourceRanges = []string{"192.0.2.0/24", "2001:db8::/64", " "}
	lb.Spec.LoadBalancerIP, lb.Spec.LoadBalancerClass = "192.0.2.99", ptr.To("example.com/lb")
	lb.Status.LoadBalancer.Ingress = []v1.LoadBalancerIngress{
		{IP: "192.0.2.20", Hostname: "lb.example.com", IPMode: ptr.To(v1.LoadBalancerIPModeVIP)},
		{IP: "192.0.2.21", IPMode: ptr.To(v1.LoadBalancerIPModeProxy)},
		{IP: "2001:db8::20", Ports: []v1.PortStatus{{Port: 80, Protocol: v1.ProtocolTCP}}},
	}
	lb.Status.Conditions = []metav1.Condition{{Type: "Ready", Status: metav1.ConditionTrue}}
	bad := svc("bad", "ClusterIP", "10.96.0.4")
	bad.Spec.ExternalIPs = []string{"not-an-ip"}
	bad.Annotations[model.LoadBalancingAnnotation] = "round-robin"

	slices := []*discovery.EndpointSlice{
		sliceOf("plain", "plain-4", discovery.AddressTypeIPv4, endpointsOf("10.244.1.1", "10.244.1.2", "10.244.2.3", "10.244.2.4")...),
		sliceOf("plain", "plain-6", discovery.AddressTypeIPv6, endpointsOf("fd00:244::1", "fd00:244::2", "fd00:244::3")...),
		sliceOf("local", "local-4", discovery.AddressTypeIPv4, endpointsOf("10.244.3.1", "10.244.3.2", "10.244.3.3", "10.244.3.4", "10.244.3.5")...),
		sliceOf("lb", "lb-4a", discovery.AddressTypeIPv4, endpointsOf("10.244.4.1", "10.244.4.2")...),
		sliceOf("lb", "lb-4b", discovery.AddressTypeIPv4, endpointsOf("10.244.4.2", "10.244.4.3", "10.244.4.4")...),
		sliceOf("lb", "lb-6", discovery.AddressTypeIPv6, endpointsOf("fd00:244::4:1", "fd00:244::4:2")...),
		sliceOf("bad", "bad-4", discovery.AddressTypeIPv4, endpointsOf("10.244.5.1", "fd00::5", "garbage")...),
	}
	node := &v1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: "node-1", Labels: map[string]string{v1.LabelTopologyZone: "zone-b"},
			Annotations: map[string]string{"node.alpha.kubernetes.io/ttl": "0"}},
		Spec: v1.NodeSpec{PodCIDRs: []string{"10.244.1.0/24", "fd00:244::/64"},
			Taints: []v1.Taint{{Key: "example.com/x", Effect: v1.TaintEffectNoSchedule}}},
		Status: v1.NodeStatus{Addresses: []v1.NodeAddress{{Type: v1.NodeInternalIP, Address: "192.0.2.1"}, {Type: v1.NodeInternalIP, Address: "2001:db8::1"}},
			Images: []v1.ContainerImage{{Names: []string{"registry.example.com/app:1"}, SizeBytes: 1 << 20}}},
	}
	return []*v1.Service{plain, local, lb, bad}, slices, node
}

func slimAll(svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) ([]*v1.Service, []*discovery.EndpointSlice, *v1.Node) {
	var outSvcs []*v1.Service
	var outSlices []*discovery.EndpointSlice
	for _, s := range svcs {
		outSvcs = append(outSvcs, slim(s.DeepCopy(), always).(*v1.Service))
	}
	for _, s := range slices {
		outSlices = append(outSlices, slim(s.DeepCopy(), always).(*discovery.EndpointSlice))
	}
	return outSvcs, outSlices, slim(node.DeepCopy(), always).(*v1.Node)
}

func sortedProblems(p []model.Problem) []model.Problem {
	sort.Slice(p, func(i, j int) bool { return fmt.Sprint(p[i]) < fmt.Sprint(p[j]) })
	return p
}

// The model and the rulesets built from slimmed objects are those built from the
// originals, and the pipeline leaves the values slimmed objects share as they were.
func TestSlimBuildsTheSameModel(t *testing.T) {
	svcs, slices, node := modelInput()
	slimSvcs, slimSlices, slimNode := slimAll(svcs, slices, node)
	cfg := pipeline.Config{
		Compile: compile.Config{
			MasqueradeBit: 14,
			DetectLocal:   compile.DetectLocal{Mode: compile.LocalNodeCIDR},
		},
		ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/16")},
	}
	run := func(svcs []*v1.Service, slices []*discovery.EndpointSlice, node *v1.Node) (*model.Snapshot, []*nft.Ruleset, []model.Problem) {
		pl := pipeline.New()
		snap, rs, problems, err := pl.Full(cfg, svcs, slices, node)
		if err != nil {
			t.Fatal(err)
		}
		snap.Changes = model.Changes{} // refers to its cache
		return snap, rs, sortedProblems(problems)
	}
	wantSnap, wantRS, wantProblems := run(svcs, slices, node)
	gotSnap, gotRS, gotProblems := run(slimSvcs, slimSlices, slimNode)
	if !reflect.DeepEqual(gotSnap, wantSnap) {
		t.Errorf("snapshot from slimmed objects:\n%+v\nwant\n%+v", gotSnap, wantSnap)
	}
	if !reflect.DeepEqual(gotRS, wantRS) {
		t.Error("rulesets from slimmed objects differ")
	}
	if !reflect.DeepEqual(gotProblems, wantProblems) || len(wantProblems) == 0 {
		t.Errorf("problems from slimmed objects: %v, want %v (not none)", gotProblems, wantProblems)
	}
	// the input exercises topology and both policies
	local := 0
	for _, sp := range wantSnap.Services {
		for _, e := range sp.Endpoints {
			if e.Hints != nil && e.NodeName == "node-1" {
				local++
			}
		}
	}
	if local == 0 || len(wantSnap.Node.PodCIDRs) != 2 || wantSnap.Node.Zone != "zone-b" {
		t.Errorf("the input does not exercise what it should: %d local endpoints with hints, node %+v", local, wantSnap.Node)
	}

	// Every field set: the model sees no difference either (garbage addresses and all:
	// the problems match too).
	fsvc, fslice := filled[v1.Service](), filled[discovery.EndpointSlice]()
	fsvc.Name, fsvc.Namespace, fslice.Namespace = "web", "default", "default"
	fslice.Labels[discovery.LabelServiceName], fslice.AddressType = "web", discovery.AddressTypeIPv4
	fsvc.Spec.ClusterIPs = []string{"10.96.0.9"}
	fsvc.Spec.Ports[0].Protocol, fslice.Ports[0].Name, fslice.Ports[0].Protocol = v1.ProtocolTCP, &fsvc.Spec.Ports[0].Name, ptr.To(v1.ProtocolTCP)
	fslice.Endpoints[0].Addresses[0], fslice.Endpoints[1].Addresses[0] = "10.1.0.1", "10.1.0.2"
	fnode := filled[v1.Node]()
	wantSnap, _, wantProblems = run([]*v1.Service{fsvc}, []*discovery.EndpointSlice{fslice}, fnode)
	gotSnap, _, gotProblems = run(slimAll([]*v1.Service{fsvc}, []*discovery.EndpointSlice{fslice}, fnode))
	if !reflect.DeepEqual(gotSnap, wantSnap) || !reflect.DeepEqual(gotProblems, wantProblems) || len(wantSnap.Services) == 0 {
		t.Errorf("filled objects: snapshot\n%+v\nwant\n%+v\nproblems %v, want %v", gotSnap, wantSnap, gotProblems, wantProblems)
	}

	if !sharedTrue || sharedFalse || sharedTCP != v1.ProtocolTCP || sharedUDP != v1.ProtocolUDP || sharedSCTP != v1.ProtocolSCTP ||
		sharedITPCluster != v1.ServiceInternalTrafficPolicyCluster || sharedITPLocal != v1.ServiceInternalTrafficPolicyLocal ||
		sharedVIP != v1.LoadBalancerIPModeVIP || sharedProxyMode != v1.LoadBalancerIPModeProxy {
		t.Error("the pipeline wrote through a shared pointer of a slimmed object")
	}
	// and the slimmed objects do point to them
	if eps := slimSlices[0].Endpoints; eps[1].Conditions.Ready != &sharedTrue || eps[2].Conditions.Ready != &sharedFalse {
		t.Errorf("conditions not shared: %p %p", eps[1].Conditions.Ready, eps[2].Conditions.Ready)
	}
}

// What a slimmed slice shares and how little it allocates.
func TestSlimSliceLayout(t *testing.T) {
	s := slim(heapBenchSlice(7, true), always).(*discovery.EndpointSlice)
	if len(s.Endpoints) != cap(s.Endpoints) || len(s.Ports) != cap(s.Ports) {
		t.Errorf("arrays not exact: endpoints %d/%d, ports %d/%d", len(s.Endpoints), cap(s.Endpoints), len(s.Ports), cap(s.Ports))
	}
	nodes := map[*string]bool{}
	for i := range s.Endpoints {
		nodes[s.Endpoints[i].NodeName] = true
		if i > 0 && uintptr(unsafe.Pointer(&s.Endpoints[i].Addresses[0])) != uintptr(unsafe.Pointer(&s.Endpoints[i-1].Addresses[0]))+unsafe.Sizeof("") {
			t.Error("addresses not in one array")
		}
	}
	if len(nodes) != 3 {
		t.Errorf("%d node name pointers for 3 node names", len(nodes))
	}
	allocs := testing.AllocsPerRun(100, func() {
		s := heapBenchSlice(7, true)
		s.Annotations = nil
		slim(s, always)
	}) - testing.AllocsPerRun(100, func() { heapBenchSlice(7, true) })
	// endpoints, []string, hints (three empty), ports, port numbers, labels map (2),
	// string bytes, packer (2)
	if allocs > 12 {
		t.Errorf("slim allocates %.0f times for a 10-endpoint slice", allocs)
	}
}

// A slice with endpoints on 1,000 distinct 253-character nodes in 1,000 distinct zones
// leaves nothing behind once it is gone: slim keeps no state across objects.
func TestSlimHostileSliceLeavesNothing(t *testing.T) {
	build := func(k int) *discovery.EndpointSlice {
		var eps []discovery.Endpoint
		for i := range 1000 {
			name := fmt.Sprintf("%d-%d-", k, i)
			name += strings.Repeat("n", 253-len(name))
			eps = append(eps, discovery.Endpoint{Addresses: []string{fmt.Sprintf("10.%d.%d.1", i/256, i%256)},
				NodeName: ptr.To(name), Zone: ptr.To(strings.ToUpper(name))})
		}
		return sliceOf("web", "web-1", discovery.AddressTypeIPv4, eps...)
	}
	check := func(k int) {
		want := wantSlice(build(k), true)
		got := slim(build(k), always).(*discovery.EndpointSlice)
		if !reflect.DeepEqual(got, want) {
			t.Fatal("hostile slice slimmed wrong")
		}
	}
	check(0) // warm up
	before := heapLive()
	for k := range 20 {
		check(k + 1)
	}
	after := heapLive()
	// 20 slices of 1,000 × 2 × 253 bytes (10 MB) went through; a few KiB of noise
	if after > before+256<<10 {
		t.Errorf("live heap grew by %d bytes after slimming and dropping hostile slices", after-before)
	}
}
