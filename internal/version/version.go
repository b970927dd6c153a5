// Package version tells which nftproxy this is: the version and git commit set at link
// time, else what the Go toolchain recorded in the binary (the module version, and
// vcs.revision for a build from a git checkout). It prints them as kube-proxy's
// --version does and exports them as the nftproxy_build_info metric.
//
// The version comes from the VERSION file at the repository's root: `make release` links
// it as it is (v0.1.0), `make build` and `make image` as a pre-release of it with the
// commit (v0.1.0-dev.g<short commit>). By hand:
//
//	go build -ldflags "-X github.com/nftproxy/nftproxy/internal/version.gitVersion=$(cat VERSION) \
//	  -X github.com/nftproxy/nftproxy/internal/version.gitCommit=$(git rev-parse HEAD)" ./cmd/nftproxy
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	apiversion "k8s.io/apimachinery/pkg/version"
)

// Set with -ldflags -X; empty means "ask the build info".
var (
	gitVersion   string // e.g. v0.1.0
	gitCommit    string // full commit hash
	gitTreeState string // "clean" or "dirty"
	buildDate    string // RFC 3339, e.g. 2026-11-24T17:00:00Z
)

// Unknown is the version of a build that carries none (go run, a test binary).
const Unknown = "v0.0.0-unknown"

// readBuildInfo is debug.ReadBuildInfo, replaced in tests.
var readBuildInfo = debug.ReadBuildInfo

// Get returns this binary's version information in the shape of Kubernetes'
// version.Info (what `kube-proxy --version=raw` prints).
func Get() apiversion.Info {
	info := apiversion.Info{
		GitVersion:   gitVersion,
		GitCommit:    gitCommit,
		GitTreeState: gitTreeState,
		BuildDate:    buildDate,
		GoVersion:    runtime.Version(),
		Compiler:     runtime.Compiler,
		Platform:     runtime.GOOS + "/" + runtime.GOARCH,
	}
	if bi, ok := readBuildInfo(); ok {
		if info.GitVersion == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.GitVersion = bi.Main.Version // go install …@vX.Y.Z
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				if info.GitCommit == "" {
					info.GitCommit = s.Value
				}
			case "vcs.modified":
				if info.GitTreeState == "" {
					info.GitTreeState = map[string]string{"true": "dirty", "false": "clean"}[s.Value]
				}
			case "vcs.time":
				if info.BuildDate == "" {
					info.BuildDate = s.Value // the commit's time: the best a plain build knows
				}
			}
		}
	}
	if info.GitVersion == "" {
		info.GitVersion = Unknown
	}
	info.Major, info.Minor = majorMinor(info.GitVersion)
	return info
}

// majorMinor splits "v1.2.3-rc.1" into "1" and "2".
func majorMinor(v string) (major, minor string) {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return "", ""
	}
	return parts[0], parts[1]
}

// String is what --version prints: "nftproxy v0.1.0", as kube-proxy prints
// "Kubernetes v1.37.0".
func String() string { return "nftproxy " + Get().GitVersion }

// Raw is what --version=raw prints: the whole version.Info as a Go value, as
// kube-proxy's --version=raw.
func Raw() string { return fmt.Sprintf("%#v", Get()) }

// NewCollector returns the nftproxy_build_info gauge: always 1, with the version, git
// commit and Go version as labels (the usual build_info convention, so that dashboards
// can join on it and alerts can pin a version).
func NewCollector() prometheus.Collector {
	info := Get()
	g := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "nftproxy_build_info",
		Help: "A metric with a constant '1' value labeled by the version, git commit and Go version nftproxy was built from.",
		ConstLabels: prometheus.Labels{
			"version":    info.GitVersion,
			"git_commit": info.GitCommit,
			"go_version": info.GoVersion,
		},
	})
	g.Set(1)
	return g
}
