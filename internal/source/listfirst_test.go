package source

import (
	"testing"

	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/watchlist"
)

// TestListFirst: the informers' reflectors start with a list (streamList) unless
// KUBE_FEATURE_WatchListClient=true is set, and never ask a client that cannot stream
// (the fake clientset) for a watch-list.
func TestListFirst(t *testing.T) {
	streams := struct{}{} // a client that does not declare itself unable to stream
	for _, tc := range []struct {
		env       string
		client    any
		watchList bool
	}{
		{"", streams, false},
		{"false", streams, false},
		{"true", streams, true},
		{"true", fake.NewClientset(), false},
	} {
		t.Setenv("KUBE_FEATURE_WatchListClient", tc.env)
		lw := listWatcher(&cache.ListWatch{}, tc.client)
		if got := !watchlist.DoesClientNotSupportWatchListSemantics(lw); got != tc.watchList {
			t.Errorf("KUBE_FEATURE_WatchListClient=%q, client %T: watch-list %v, want %v", tc.env, tc.client, got, tc.watchList)
		}
	}
}
