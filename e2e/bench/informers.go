package bench

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Which way a proxy's informers filled their caches, read from kube-apiserver's own
// metrics around its cold start. client-go's informers first ask for a watch-list
// (streaming list: a watch with sendInitialEvents=true, WatchListClient on by default since
// v1.35); the API server serves one only when etcd supports progress requests (3.4.31+,
// 3.5.13+), and when it does not, the informers fall back to a LIST and a watch. The
// API server counts a watch-list in apiserver_watch_list_duration_seconds (observed when
// the initial events end) and a LIST in apiserver_request_total{verb="LIST"}. The API
// server lists too (its NodePort repair loop lists every Service every 3 minutes), so a
// cold start that overlaps that reads "watch-list and list".

// informerResources are the resources both proxies' informers fill their caches with at
// a cold start, the bench's objects.
var informerResources = []string{"services", "endpointslices"}

// listing is the API server's counts for informerResources, one scrape.
type listing struct {
	watchLists   map[string]float64 // apiserver_watch_list_duration_seconds_count
	watchListSec map[string]float64 // its _sum
	lists        map[string]float64 // apiserver_request_total{verb="LIST"}
}

// InformerPath says how the informers of one cold start filled their caches.
type InformerPath struct {
	// Path is "watch-list" (every resource streamed), "list" (every resource listed),
	// or per resource ("services: list, endpointslices: watch-list") otherwise.
	Path string `json:"path"`
	// WatchListSeconds is the API server's time, summed over the resources, from each
	// watch-list request to the end of its initial events (0 on the list path).
	WatchListSeconds float64 `json:"watch_list_server_s,omitempty"`
}

// apiserverListing scrapes kube-apiserver's /metrics (through the admin client).
func (s *suite) apiserverListing(ctx context.Context) (listing, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := s.c.Client.Discovery().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return listing{}, fmt.Errorf("kube-apiserver /metrics: %w", err)
	}
	return parseListing(string(raw))
}

// parseListing reads the counts of informerResources from an API server scrape.
func parseListing(text string) (listing, error) {
	var keep strings.Builder // the two families only: the whole scrape is megabytes
	for line := range strings.SplitSeq(text, "\n") {
		if strings.HasPrefix(line, "apiserver_watch_list_duration_seconds_") ||
			strings.HasPrefix(line, "apiserver_request_total{") && strings.Contains(line, `verb="LIST"`) {
			keep.WriteString(line)
			keep.WriteByte('\n')
		}
	}
	m, err := parseMetrics(keep.String())
	if err != nil {
		return listing{}, err
	}
	l := listing{watchLists: map[string]float64{}, watchListSec: map[string]float64{}, lists: map[string]float64{}}
	for _, x := range m {
		r := x.Labels["resource"]
		switch x.Name {
		case "apiserver_watch_list_duration_seconds_count":
			l.watchLists[r] += x.Value
		case "apiserver_watch_list_duration_seconds_sum":
			l.watchListSec[r] += x.Value
		case "apiserver_request_total":
			l.lists[r] += x.Value
		}
	}
	return l, nil
}

// path is ip.Path, "?" for nil.
func (ip *InformerPath) path() string {
	if ip == nil {
		return "?"
	}
	return ip.Path
}

// cell is the report's table cell.
func (ip *InformerPath) cell() string {
	if ip == nil {
		return "?"
	}
	if ip.WatchListSeconds > 0 {
		return fmt.Sprintf("%s (%s)", ip.Path, secs(ip.WatchListSeconds))
	}
	return ip.Path
}

// informerPath compares two scrapes taken before and after a cold start.
func informerPath(before, after listing) *InformerPath {
	ip := &InformerPath{}
	var parts []string
	same := ""
	for i, r := range informerResources {
		wl, ls := after.watchLists[r]-before.watchLists[r], after.lists[r]-before.lists[r]
		ip.WatchListSeconds += after.watchListSec[r] - before.watchListSec[r]
		var p string
		switch {
		case wl > 0 && ls == 0:
			p = "watch-list"
		case wl == 0 && ls > 0:
			p = "list"
		case wl > 0 && ls > 0:
			p = "watch-list and list"
		default:
			p = "none seen"
		}
		parts = append(parts, r+": "+p)
		if i == 0 {
			same = p
		} else if p != same {
			same = ""
		}
	}
	ip.Path = same
	if same == "" {
		ip.Path = strings.Join(parts, ", ")
	}
	return ip
}
