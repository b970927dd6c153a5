package bench

import (
	"fmt"
	"math"
	"testing"
)

// The informer path is read from the API server's counts before and after a cold start:
// watch-list requests (apiserver_watch_list_duration_seconds) against LIST requests.
func TestInformerPath(t *testing.T) {
	scrape := func(wlSvc, wlEps, listSvc, listEps float64) listing {
		t.Helper()
		text := fmt.Sprintf(`# HELP apiserver_watch_list_duration_seconds x
apiserver_watch_list_duration_seconds_bucket{component="",group="",resource="services",scope="cluster",version="v1",le="+Inf"} %[1]v
apiserver_watch_list_duration_seconds_sum{component="",group="",resource="services",scope="cluster",version="v1"} %[5]v
apiserver_watch_list_duration_seconds_count{component="",group="",resource="services",scope="cluster",version="v1"} %[1]v
apiserver_watch_list_duration_seconds_sum{component="",group="discovery.k8s.io",resource="endpointslices",scope="cluster",version="v1"} %[6]v
apiserver_watch_list_duration_seconds_count{component="",group="discovery.k8s.io",resource="endpointslices",scope="cluster",version="v1"} %[2]v
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="cluster",subresource="",verb="LIST",version="v1"} %[3]v
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="services",scope="cluster",subresource="",verb="POST",version="v1"} 99
apiserver_request_total{code="200",component="apiserver",dry_run="",group="discovery.k8s.io",resource="endpointslices",scope="namespace",subresource="",verb="LIST",version="v1"} %[4]v
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="nodes",scope="cluster",subresource="",verb="LIST",version="v1"} 7
`, wlSvc, wlEps, listSvc, listEps, wlSvc*0.5, wlEps*0.25)
		l, err := parseListing(text)
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	base := scrape(2, 2, 3, 3)
	for _, tc := range []struct {
		after   listing
		path    string
		serverS float64
	}{
		{scrape(3, 3, 3, 3), "watch-list", 0.75},
		{scrape(2, 2, 4, 4), "list", 0},
		{scrape(3, 2, 3, 4), "services: watch-list, endpointslices: list", 0.5},
		{scrape(3, 3, 4, 3), "services: watch-list and list, endpointslices: watch-list", 0.75},
		{base, "none seen", 0},
	} {
		got := informerPath(base, tc.after)
		if got.Path != tc.path || math.Abs(got.WatchListSeconds-tc.serverS) > 1e-9 {
			t.Errorf("informerPath = %+v, want %q, %v s", got, tc.path, tc.serverS)
		}
	}
}
