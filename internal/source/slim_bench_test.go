package source

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/go-logr/logr"
	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

// API-server-shaped objects for BenchmarkInformerObjectHeap: e2e/bench/api.go's
// Service and 10-endpoint EndpointSlice with what the API server adds (uid,
// resourceVersion, creationTimestamp, a managedFields entry, the Service defaults); with
// realistic, a Service with a 3-label selector and 5 labels, and the slice the
// EndpointSlice controller would write for it (generateName, owner reference, the
// Service's labels, target references, three nodes in two zones).
func heapBenchService(i int, realistic bool) *v1.Service {
	ip := fmt.Sprintf("10.%d.%d.%d", 96+i/65536, (i/256)%256, i%256)
	s := &v1.Service{
		ObjectMeta: heapBenchMeta(fmt.Sprintf("svc-%05d", i), i),
		Spec: v1.ServiceSpec{
			Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			Ports: []v1.ServicePort{{Name: "http", Protocol: v1.ProtocolTCP, Port: 80,
				TargetPort: intstr.FromInt32(8080)}},
			SessionAffinity:       v1.ServiceAffinityNone,
			IPFamilies:            []v1.IPFamily{v1.IPv4Protocol},
			IPFamilyPolicy:        ptr.To(v1.IPFamilyPolicySingleStack),
			InternalTrafficPolicy: ptr.To(v1.ServiceInternalTrafficPolicyCluster),
		},
	}
	if realistic {
		s.Labels = heapBenchLabels(s.Name)
		s.Spec.Selector = map[string]string{"app.kubernetes.io/name": s.Name, "app.kubernetes.io/instance": "prod", "app.kubernetes.io/component": "server"}
	}
	return s
}

func heapBenchLabels(name string) map[string]string {
	return map[string]string{"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "prod",
		"app.kubernetes.io/component": "server", "app.kubernetes.io/managed-by": "Helm", "helm.sh/chart": name + "-1.2.3"}
}

func heapBenchMeta(name string, i int) metav1.ObjectMeta {
	created := metav1.NewTime(time.Date(2026, 1, 1, 0, 0, i%60, 0, time.UTC))
	return metav1.ObjectMeta{
		Name: name, Namespace: "bench",
		UID:               types.UID(fmt.Sprintf("0b6c5f0e-3d7a-4c1e-9a55-%012d", i)),
		ResourceVersion:   fmt.Sprint(1000000 + i),
		CreationTimestamp: created,
		ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "bench", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: &created, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{".":{},"f:kubernetes.io/service-name":{}}},"f:spec":{"f:ports":{}}}`)}},
	}
}

func heapBenchSlice(i int, realistic bool) *discovery.EndpointSlice {
	svc := fmt.Sprintf("svc-%05d", i)
	s := &discovery.EndpointSlice{
		ObjectMeta:  heapBenchMeta(svc+"-bench", i),
		AddressType: discovery.AddressTypeIPv4,
		Ports: []discovery.EndpointPort{{Name: ptr.To("http"), Protocol: ptr.To(v1.ProtocolTCP),
			Port: ptr.To(int32(8080))}},
	}
	s.Generation = 1
	s.Labels = map[string]string{discovery.LabelServiceName: svc, discovery.LabelManagedBy: "nftproxy-bench"}
	// a trigger time from before the proxy started: the informers drop it
	s.Annotations = map[string]string{TriggerTimeAnnotation: "2026-01-01T00:00:00.123456789Z"}
	for j := range 10 {
		k := i*10 + j
		s.Endpoints = append(s.Endpoints, discovery.Endpoint{
			Addresses:  []string{fmt.Sprintf("10.%d.%d.%d", 128+k/65536, (k/256)%256, k%256)},
			Conditions: discovery.EndpointConditions{Ready: ptr.To(true), Serving: ptr.To(true), Terminating: ptr.To(false)},
			NodeName:   ptr.To("node-1"),
		})
	}
	if realistic {
		s.Name, s.GenerateName = svc+"-x7k2p", svc+"-"
		s.Labels = heapBenchLabels(svc)
		s.Labels[discovery.LabelServiceName] = svc
		s.Labels[discovery.LabelManagedBy] = "endpointslice-controller.k8s.io"
		s.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Service", Name: svc,
			UID: types.UID(fmt.Sprintf("7d1c5f0e-3d7a-4c1e-9a55-%012d", i)), Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true)}}
		for j := range s.Endpoints {
			e := &s.Endpoints[j]
			e.NodeName = ptr.To(fmt.Sprintf("worker-%d.cluster.example.com", (i+j)%3))
			e.Zone = ptr.To(fmt.Sprintf("eu-west-1%c", 'a'+(i+j)%3%2))
			e.TargetRef = &v1.ObjectReference{Kind: "Pod", Namespace: "bench", Name: fmt.Sprintf("%s-7f9c8d6b5-%05d", svc, j),
				UID: types.UID(fmt.Sprintf("9e2c5f0e-3d7a-4c1e-9a55-%012d", i*10+j))}
		}
	}
	return s
}

// heapDecode unmarshals a protobuf list as the reflector does (the list, then a copy of
// each item: meta.ExtractListWithAlloc) and passes each item through transform.
func heapDecode(data []byte, list interface {
	kruntime.Object
	Unmarshal([]byte) error
}, transform func(any) (any, error), out []any) {
	if err := list.Unmarshal(data); err != nil {
		panic(err)
	}
	items, err := meta.ExtractListWithAlloc(list)
	if err != nil {
		panic(err)
	}
	for i, it := range items {
		if out[i], err = transform(it); err != nil {
			panic(err)
		}
	}
}

func heapLive() uint64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC()
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// BenchmarkInformerObjectHeap reports what the informer caches keep per object: live
// heap bytes per Service and per 10-endpoint EndpointSlice (after a GC, without the
// slice of interfaces that holds them), decoded from protobuf as the reflector decodes
// a list, with no transform and with the informers' transform. Run it with
// -benchtime=1x: an iteration decodes 30,000 of each.
func BenchmarkInformerObjectHeap(b *testing.B) {
	const n = 30000
	tr := NewTracker(logr.Discard(), time.Now())
	for _, shape := range []string{"bench", "realistic"} {
		svcs, slices := &v1.ServiceList{}, &discovery.EndpointSliceList{}
		for i := range n {
			svcs.Items = append(svcs.Items, *heapBenchService(i, shape == "realistic"))
			slices.Items = append(slices.Items, *heapBenchSlice(i, shape == "realistic"))
		}
		svcData, err := svcs.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		sliceData, err := slices.Marshal()
		if err != nil {
			b.Fatal(err)
		}
		svcs, slices = nil, nil
		for _, variant := range []struct {
			name      string
			transform func(any) (any, error)
		}{{"none", func(o any) (any, error) { return o, nil }}, {"transform", func(o any) (any, error) { return slim(o, tr.timed), nil }}} {
			b.Run(fmt.Sprintf("shape=%s/transform=%s", shape, variant.name), func(b *testing.B) {
				var perSvc, perSlice float64
				for b.Loop() {
					out := make([]any, n)
					base := heapLive()
					heapDecode(svcData, &v1.ServiceList{}, variant.transform, out)
					perSvc = float64(heapLive()-base) / n
					clear(out)
					base = heapLive()
					heapDecode(sliceData, &discovery.EndpointSliceList{}, variant.transform, out)
					perSlice = float64(heapLive()-base) / n
					runtime.KeepAlive(out)
				}
				b.ReportMetric(perSvc, "B/service")
				b.ReportMetric(perSlice, "B/slice")
			})
		}
	}
}
