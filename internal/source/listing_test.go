package source

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/pager"
)

const protoType = "application/vnd.kubernetes.protobuf"

// testSliceList is a list of fully populated EndpointSlices (every field set, see
// filler) with the list metadata a paginated list has.
func testSliceList(n int) *discovery.EndpointSliceList {
	l := &discovery.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "4711", Continue: "next-page", RemainingItemCount: new(int64(9))}}
	for i := range n {
		s := filled[discovery.EndpointSlice]()
		apiValid(&s.ObjectMeta)
		s.Name = fmt.Sprintf("slice-%d", i)
		s.Endpoints = append(s.Endpoints, make([]discovery.Endpoint, i)...) // empty ones too
		l.Items = append(l.Items, *s)
	}
	return l
}

// apiValid makes a filled object's metadata encodable as JSON: managed fields are JSON.
func apiValid(m *metav1.ObjectMeta) {
	for i := range m.ManagedFields {
		m.ManagedFields[i].FieldsV1 = metav1.NewFieldsV1(`{"f:spec":{}}`)
	}
}

// apiService is a fully populated Service in namespace ns, encodable as JSON.
func apiService(name string) *v1.Service {
	s := filled[v1.Service]()
	apiValid(&s.ObjectMeta)
	s.TypeMeta, s.Namespace, s.Name = metav1.TypeMeta{}, "ns", name
	for i := range s.Spec.Ports {
		s.Spec.Ports[i].TargetPort = intstr.FromInt32(8080)
	}
	return s
}

func encodeList(t testing.TB, obj runtime.Object, gv schema.GroupVersion, contentType string) []byte {
	t.Helper()
	var enc runtime.Encoder
	if contentType == protoType {
		enc = scheme.Codecs.EncoderForVersion(protobuf.NewSerializer(scheme.Scheme, scheme.Scheme), gv)
	} else {
		enc = scheme.Codecs.LegacyCodec(gv)
	}
	b, err := runtime.Encode(enc, obj)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// listServer answers every list with status and body, written a few bytes at a time
// (each piece flushed), so that the decoder reads across many partial reads; a
// watch-list with an error (as an API server without it), a watch with the JSON event
// then nothing.
func listServer(t *testing.T, status int, contentType string, body, event []byte) (kubernetes.Interface, *[]string) {
	var paths []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		listServerMu.Lock()
		paths = append(paths, r.URL.String())
		listServerMu.Unlock()
		q := r.URL.Query()
		switch {
		case q.Get("sendInitialEvents") == "true":
			http.Error(w, "no watch-list here", http.StatusBadRequest)
			return
		case q.Get("watch") == "true":
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write(append(event, '\n'))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		for b := body; len(b) > 0; {
			n := min(len(b), 37)
			_, _ = w.Write(b[:n])
			w.(http.Flusher).Flush()
			b = b[n:]
		}
	}))
	t.Cleanup(srv.Close)
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: protoType}})
	if err != nil {
		t.Fatal(err)
	}
	return cs, &paths
}

// listServerMu guards listServer's paths.
var listServerMu sync.Mutex

// countingSlim slims as the proxy's informers do and counts the objects it slimmed.
type countingSlim struct {
	mu sync.Mutex
	n  int
}

func (c *countingSlim) slim(obj runtime.Object) runtime.Object {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return slim(obj, always).(runtime.Object)
}

// slimmedItems is a typed list's items, each a slimmed copy.
func slimmedItems(t *testing.T, list runtime.Object) []runtime.Object {
	t.Helper()
	items, err := meta.ExtractList(list.DeepCopyObject())
	if err != nil {
		t.Fatal(err)
	}
	for i := range items {
		items[i] = slim(items[i], always).(runtime.Object)
	}
	return items
}

// A streamed list is what client-go decodes from the same response, each item slimmed
// once: protobuf (decoded as it arrives) and JSON (read whole), with the list metadata
// and the request's options.
func TestStreamListDecodesAsClientGo(t *testing.T) {
	want := testSliceList(5)
	for _, ct := range []string{protoType, "application/json"} {
		t.Run(ct, func(t *testing.T) {
			cs, paths := listServer(t, http.StatusOK, ct, encodeList(t, want, discovery.SchemeGroupVersion, ct), nil)
			opts := metav1.ListOptions{LabelSelector: "a=b", ResourceVersion: "0", Limit: 500}
			ref, err := cs.DiscoveryV1().EndpointSlices("").List(context.Background(), opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(ref.Items) != len(want.Items) || ref.ResourceVersion != "4711" || ref.Continue != "next-page" {
				t.Fatalf("client-go's decode: %d items, meta %+v", len(ref.Items), ref.ListMeta)
			}
			c := &countingSlim{}
			got, err := streamList[discovery.EndpointSlice](context.Background(), cs.DiscoveryV1().RESTClient(), "endpointslices", opts,
				&discovery.EndpointSliceList{}, c.slim)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got.ListMeta, ref.ListMeta) {
				t.Errorf("list metadata %+v, want %+v", got.ListMeta, ref.ListMeta)
			}
			if wantItems := slimmedItems(t, ref); !reflect.DeepEqual(got.Items, wantItems) {
				t.Errorf("streamed list differs from client-go's, slimmed:\n%+v\nwant\n%+v", got.Items, wantItems)
			}
			if c.n != len(want.Items) {
				t.Errorf("%d objects slimmed, want each of %d once", c.n, len(want.Items))
			}
			if len(*paths) != 2 || (*paths)[0] != (*paths)[1] {
				t.Errorf("requests %q: the streamed list must ask what client-go asks", *paths)
			}
			// the reflector takes the items as they are (pointers), and copies of the list
			// are deep
			items, err := meta.ExtractListWithAlloc(got)
			if err != nil || len(items) != len(got.Items) || items[0] != got.Items[0] {
				t.Errorf("the reflector's extraction: %d items, %v", len(items), err)
			}
			if cp := got.DeepCopyObject().(*objectList); !reflect.DeepEqual(cp, got) || cp.Items[0] == got.Items[0] {
				t.Error("DeepCopyObject is not a deep copy")
			}
		})
	}
}

// The informers list through streamList and slim what their watch sends, with the
// tweak applied to both: Services here, the fake clientset's typed lists too.
func TestStreamingInformer(t *testing.T) {
	svcs := &v1.ServiceList{ListMeta: metav1.ListMeta{ResourceVersion: "12"}}
	for i := range 3 {
		svcs.Items = append(svcs.Items, *apiService(fmt.Sprintf("svc-%d", i)))
	}
	added := apiService("added")
	added.ResourceVersion = "13"
	added.TypeMeta = metav1.TypeMeta{Kind: "Service", APIVersion: "v1"}
	event, err := json.Marshal(map[string]any{"type": "ADDED", "object": added})
	if err != nil {
		t.Fatal(err)
	}
	// what the watch decodes
	added, err = decodeJSON[v1.Service](added)
	if err != nil {
		t.Fatal(err)
	}
	cs, paths := listServer(t, http.StatusOK, protoType, encodeList(t, svcs, v1.SchemeGroupVersion, protoType), event)
	fake := fake.NewClientset(&svcs.Items[0], &svcs.Items[1], &svcs.Items[2])
	for _, client := range []kubernetes.Interface{cs, fake} {
		ref, err := client.CoreV1().Services("").List(context.Background(), withTweak(ServiceListOptions))
		if err != nil || len(ref.Items) != 3 {
			t.Fatalf("client-go's list: %v", err)
		}
		c := &countingSlim{}
		inf := newServiceInformer(client, ServiceListOptions, c.slim)
		ctx, cancel := context.WithCancel(context.Background())
		go inf.Run(ctx.Done())
		if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			t.Fatal("not synced")
		}
		for i, want := range slimmedItems(t, ref) {
			obj, ok, _ := inf.GetStore().GetByKey("ns/" + ref.Items[i].Name)
			if !ok || !reflect.DeepEqual(obj, want) {
				t.Errorf("cached %s:\n%+v\nwant\n%+v", ref.Items[i].Name, obj, want)
			}
		}
		if client == cs {
			if err := wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(context.Context) (bool, error) {
				_, ok, _ := inf.GetStore().GetByKey("ns/added")
				return ok, nil
			}); err != nil {
				t.Fatal("the watched Service never arrived")
			}
			obj, _, _ := inf.GetStore().GetByKey("ns/added")
			if want := slim(added.DeepCopy(), always); !reflect.DeepEqual(obj, want) {
				t.Errorf("watched Service:\n%+v\nwant\n%+v", obj, want)
			}
			if c.n != len(ref.Items)+1 {
				t.Errorf("%d objects slimmed, want %d", c.n, len(ref.Items)+1)
			}
		}
		cancel()
	}
	listServerMu.Lock()
	defer listServerMu.Unlock()
	for _, p := range *paths {
		if !strings.Contains(p, "labelSelector=") {
			t.Errorf("request %q without the tweak", p)
		}
	}
}

// slimWatch passes bookmarks and errors untouched, and its loop ends when the
// reader stops it without reading.
func TestSlimWatch(t *testing.T) {
	in := watch.NewFakeWithChanSize(4, false)
	c := &countingSlim{}
	w := newSlimWatch(in, c.slim)
	svc := filled[v1.Service]()
	bookmark := &v1.Service{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "9", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}
	in.Add(svc.DeepCopy())
	in.Action(watch.Bookmark, bookmark)
	in.Error(&metav1.Status{Message: "gone"})
	if e := <-w.ResultChan(); e.Type != watch.Added || !reflect.DeepEqual(e.Object, slim(svc.DeepCopy(), always)) {
		t.Errorf("added: %+v", e)
	}
	if e := <-w.ResultChan(); e.Type != watch.Bookmark || e.Object != bookmark || len(bookmark.Annotations) != 1 {
		t.Errorf("bookmark: %+v", e)
	}
	if e := <-w.ResultChan(); e.Type != watch.Error {
		t.Errorf("error: %+v", e)
	}
	c.mu.Lock()
	if c.n != 1 { // the added object only, slimmed before it was sent
		t.Errorf("%d objects slimmed for an added object, a bookmark and an error", c.n)
	}
	c.mu.Unlock()
	in.Modify(svc.DeepCopy())
	in.Delete(svc.DeepCopy())
	w.Stop() // with events not read
	for range w.ResultChan() {
	}
}

// decodeJSON is obj encoded as JSON and decoded again, as a client receives it.
func decodeJSON[T any, P interface {
	*T
	runtime.Object
}](obj P) (P, error) {
	b, err := json.Marshal(obj)
	if err != nil {
		return nil, err
	}
	out := P(new(T))
	if err := json.Unmarshal(b, out); err != nil {
		return nil, err
	}
	out.GetObjectKind().SetGroupVersionKind(schema.GroupVersionKind{})
	return out, nil
}

func withTweak(tweak func(*metav1.ListOptions)) metav1.ListOptions {
	var o metav1.ListOptions
	tweak(&o)
	return o
}

// An error status is the request's error, as client-go reports it.
func TestStreamListErrorStatus(t *testing.T) {
	status := &metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure,
		Reason: metav1.StatusReasonForbidden, Code: http.StatusForbidden, Message: "no lists for you"}
	cs, _ := listServer(t, http.StatusForbidden, "application/json", encodeList(t, status, v1.SchemeGroupVersion, "application/json"), nil)
	c := &countingSlim{}
	_, err := streamList[discovery.EndpointSlice](context.Background(), cs.DiscoveryV1().RESTClient(), "endpointslices", metav1.ListOptions{},
		&discovery.EndpointSliceList{}, c.slim)
	if err == nil || !strings.Contains(err.Error(), "no lists for you") || c.n != 0 {
		t.Fatalf("error %v, %d objects slimmed: want the API's message, none", err, c.n)
	}
}

func decodeBytes(b []byte) (*objectList, error) {
	return decodeList[discovery.EndpointSlice](&protoReader{r: bufio.NewReader(bytes.NewReader(b))}, func(o runtime.Object) runtime.Object { return o })
}

// A response cut anywhere is an error or, cut after the list, the whole list: never a
// part of it. Bytes changed anywhere never panic.
func TestStreamListTruncatedOrCorrupt(t *testing.T) {
	body := encodeList(t, testSliceList(3), discovery.SchemeGroupVersion, protoType)
	if !bytes.HasPrefix(body, protoMagic) {
		t.Fatalf("protobuf body starts with %q", body[:4])
	}
	body = body[len(protoMagic):]
	want, err := decodeBytes(body)
	if err != nil || len(want.Items) != 3 {
		t.Fatalf("whole body: %v", err)
	}
	whole := 0
	for k := range len(body) {
		got, err := decodeBytes(body[:k])
		switch {
		case err == nil && reflect.DeepEqual(got, want):
			whole++
		case err == nil:
			t.Fatalf("cut at %d of %d: %d items without an error", k, len(body), len(got.Items))
		}
	}
	if whole > 40 { // only the envelope's trailing fields (content type and encoding) may be cut
		t.Errorf("%d cuts decoded the whole list", whole)
	}
	for k := range body {
		for _, x := range []byte{0xff, 0x80, 0x01} {
			c := bytes.Clone(body)
			c[k] ^= x
			_, _ = decodeBytes(c) // must not panic
		}
	}
	// a length beyond the item limit is refused before anything is allocated
	huge := append([]byte{2<<3 | 2, 0x0b, 2<<3 | 2}, binaryUvarint(maxItemBytes+1)...)
	if _, err := decodeBytes(huge); err == nil || !strings.Contains(err.Error(), "exceeds") {
		t.Errorf("oversized item: %v", err)
	}
}

func binaryUvarint(v uint64) []byte {
	var b []byte
	for v >= 0x80 {
		b = append(b, byte(v)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// A paginated list (an API server listing from etcd, without its watch cache): the
// reflector's pager asks page after page through the informer's list function and
// joins the pages' items as they are.
func TestStreamListPages(t *testing.T) {
	all := testSliceList(5)
	pages := map[string][]byte{}
	for i, cont := range []string{"", "p2"} {
		l := &discovery.EndpointSliceList{ListMeta: metav1.ListMeta{ResourceVersion: "4711"}, Items: all.Items[i*3 : min(5, i*3+3)]}
		if i == 0 {
			l.Continue = "p2"
		}
		pages[cont] = encodeList(t, l, discovery.SchemeGroupVersion, protoType)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", protoType)
		_, _ = w.Write(pages[r.URL.Query().Get("continue")])
	}))
	defer srv.Close()
	cs, err := kubernetes.NewForConfig(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: protoType}})
	if err != nil {
		t.Fatal(err)
	}
	c := &countingSlim{}
	list := listerFor[discovery.EndpointSlice](cs.DiscoveryV1().RESTClient(), "endpointslices", cs.DiscoveryV1().EndpointSlices("").List,
		func() *discovery.EndpointSliceList { return &discovery.EndpointSliceList{} }, c.slim)
	p := pager.New(pager.SimplePageFunc(func(opts metav1.ListOptions) (runtime.Object, error) {
		return list(context.Background(), opts)
	}))
	p.PageSize = 3
	got, paginated, err := p.ListWithAlloc(context.Background(), metav1.ListOptions{})
	if err != nil || !paginated {
		t.Fatalf("paginated %v, %v", paginated, err)
	}
	items, err := meta.ExtractListWithAlloc(got)
	if err != nil {
		t.Fatal(err)
	}
	ref := &discovery.EndpointSliceList{}
	for _, page := range []string{"", "p2"} {
		l := &discovery.EndpointSliceList{}
		if err := runtime.DecodeInto(scheme.Codecs.UniversalDeserializer(), pages[page], l); err != nil {
			t.Fatal(err)
		}
		ref.Items = append(ref.Items, l.Items...)
	}
	if want := slimmedItems(t, ref); !reflect.DeepEqual(items, want) || c.n != 5 {
		t.Errorf("%d items from the pages (%d slimmed), want %d", len(items), c.n, len(want))
	}
}

// presize gives a slice about to be decoded room for exactly its endpoints (at most
// maxPresized), so that it decodes without growing the array; a Service is left alone,
// and malformed bytes never panic.
func TestPresize(t *testing.T) {
	for _, n := range []int{0, 1, 10, maxPresized + 500} {
		s := heapBenchSlice(3, true)
		s.Endpoints = nil
		for i := range n {
			s.Endpoints = append(s.Endpoints, discovery.Endpoint{Addresses: []string{fmt.Sprintf("10.0.%d.%d", i/256, i%256)}})
		}
		data, err := s.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		if got := countBytesFields(data, 2); got != n {
			t.Errorf("%d endpoints counted as %d", n, got)
		}
		obj := &discovery.EndpointSlice{}
		presize(obj, data)
		if err := obj.Unmarshal(data); err != nil {
			t.Fatal(err)
		}
		if want := min(n, maxPresized); len(obj.Endpoints) != n || n <= maxPresized && cap(obj.Endpoints) != want {
			t.Errorf("%d endpoints decoded into len %d cap %d, want cap %d", n, len(obj.Endpoints), cap(obj.Endpoints), want)
		}
		if !reflect.DeepEqual(obj.Endpoints, s.Endpoints) { // nil when there are none, as decoded without presize
			t.Errorf("%d endpoints: decoded into the presized array, the endpoints differ from the original", n)
		}
		// every prefix and every single-byte change: a count no larger than the bytes allow
		for i := range data {
			if c := countBytesFields(data[:i], 2); c > i/2 || c > n {
				t.Fatalf("prefix of %d bytes: counted %d", i, c)
			}
			b := bytes.Clone(data)
			b[i] ^= 0xff
			if c := countBytesFields(b, 2); c > len(b)/2 {
				t.Fatalf("byte %d changed: counted %d", i, c)
			}
			if i > 2000 {
				break // the long slice: its first endpoints are enough
			}
		}
	}
	svc := &v1.Service{}
	data, _ := heapBenchService(1, true).Marshal()
	presize(svc, data)
	if !reflect.DeepEqual(svc, &v1.Service{}) {
		t.Errorf("presize changed a Service: %+v", svc)
	}
}
