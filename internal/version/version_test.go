package version

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func setLinked(t *testing.T, version, commit string) {
	t.Helper()
	oldV, oldC, oldS, oldD := gitVersion, gitCommit, gitTreeState, buildDate
	gitVersion, gitCommit, gitTreeState, buildDate = version, commit, "", ""
	t.Cleanup(func() { gitVersion, gitCommit, gitTreeState, buildDate = oldV, oldC, oldS, oldD })
}

func setBuildInfo(t *testing.T, bi *debug.BuildInfo) {
	t.Helper()
	old := readBuildInfo
	readBuildInfo = func() (*debug.BuildInfo, bool) { return bi, bi != nil }
	t.Cleanup(func() { readBuildInfo = old })
}

func TestLinkerValuesWin(t *testing.T) {
	setLinked(t, "v0.4.1", "0123456789abcdef0123456789abcdef01234567")
	setBuildInfo(t, &debug.BuildInfo{Main: debug.Module{Version: "v9.9.9"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "ffff"}, {Key: "vcs.modified", Value: "true"}}})
	info := Get()
	if info.GitVersion != "v0.4.1" || info.GitCommit != "0123456789abcdef0123456789abcdef01234567" {
		t.Errorf("linker values lost: %+v", info)
	}
	if info.Major != "0" || info.Minor != "4" || info.GitTreeState != "dirty" {
		t.Errorf("major/minor/tree state: %+v", info)
	}
	if got := String(); got != "nftproxy v0.4.1" {
		t.Errorf("String() = %q", got)
	}
	raw := Raw()
	for _, want := range []string{`version.Info{Major:"0", Minor:"4"`, `GitVersion:"v0.4.1"`,
		`GitCommit:"0123456789abcdef0123456789abcdef01234567"`, `GoVersion:"` + runtime.Version() + `"`,
		`Compiler:"gc"`, `Platform:"` + runtime.GOOS + "/" + runtime.GOARCH + `"`} {
		if !strings.Contains(raw, want) {
			t.Errorf("Raw() lacks %s:\n%s", want, raw)
		}
	}
}

func TestBuildInfoFallback(t *testing.T) {
	setLinked(t, "", "")
	setBuildInfo(t, &debug.BuildInfo{Main: debug.Module{Version: "(devel)"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "abc123"}, {Key: "vcs.modified", Value: "false"},
			{Key: "vcs.time", Value: "2026-11-24T17:00:00Z"}}})
	info := Get()
	if info.GitVersion != Unknown || info.GitCommit != "abc123" || info.GitTreeState != "clean" || info.BuildDate != "2026-11-24T17:00:00Z" {
		t.Errorf("fallback: %+v", info)
	}
	setBuildInfo(t, &debug.BuildInfo{Main: debug.Module{Version: "v0.3.0"}})
	if info := Get(); info.GitVersion != "v0.3.0" || info.Major != "0" || info.Minor != "3" {
		t.Errorf("module version not used: %+v", info)
	}
	setBuildInfo(t, nil)
	if info := Get(); info.GitVersion != Unknown || info.GitCommit != "" {
		t.Errorf("no build info: %+v", info)
	}
}

func TestCollector(t *testing.T) {
	setLinked(t, "v0.4.1", "c0ffee")
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector())
	want := `# HELP nftproxy_build_info A metric with a constant '1' value labeled by the version, git commit and Go version nftproxy was built from.
# TYPE nftproxy_build_info gauge
nftproxy_build_info{git_commit="c0ffee",go_version="` + runtime.Version() + `",version="v0.4.1"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "nftproxy_build_info"); err != nil {
		t.Error(err)
	}
}
