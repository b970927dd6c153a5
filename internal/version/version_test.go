package version

import (
	"os"
	"regexp"
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

// The VERSION file is the one source of the version: a semantic version whose major and
// minor parse, with its entry in CHANGELOG.md (e2e/hack/release.sh refuses to release
// without one).
func TestVersionFile(t *testing.T) {
	b, err := os.ReadFile("../../VERSION")
	if err != nil {
		t.Fatal(err)
	}
	v := strings.TrimSpace(string(b))
	if !regexp.MustCompile(`^v(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z.-]+)?$`).MatchString(v) || string(b) != v+"\n" {
		t.Fatalf("VERSION holds %q, want one line vMAJOR.MINOR.PATCH[-PRERELEASE]", b)
	}
	setLinked(t, v+"-dev.g0123abc", "")
	if info := Get(); info.Major == "" || info.Minor == "" {
		t.Errorf("a dev build of %s has no major/minor: %+v", v, info)
	}
	changelog, err := os.ReadFile("../../CHANGELOG.md")
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^## \[` + regexp.QuoteMeta(strings.TrimPrefix(v, "v")) + `\] - \d{4}-\d{2}-\d{2}$`).Match(changelog) {
		t.Errorf("CHANGELOG.md has no '## [%s] - YYYY-MM-DD' entry", strings.TrimPrefix(v, "v"))
	}
	if !strings.Contains(string(changelog), "\n## [Unreleased]\n") {
		t.Error("CHANGELOG.md has no '## [Unreleased]' section")
	}
}
