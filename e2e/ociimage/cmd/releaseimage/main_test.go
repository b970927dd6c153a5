package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// The release image must be what the Containerfile builds: the same binary path as
// entrypoint and the same user. This fails when one of them changes alone.
func TestMatchesContainerfile(t *testing.T) {
	b, err := os.ReadFile("../../../../Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	cf := string(b)
	if m := regexp.MustCompile(`(?m)^ENTRYPOINT \["([^"]+)"\]$`).FindStringSubmatch(cf); m == nil || m[1] != binPath {
		t.Errorf("Containerfile's ENTRYPOINT %v, releaseimage's %s", m, binPath)
	}
	if !regexp.MustCompile(`(?m)^COPY --from=build /out/nftproxy ` + regexp.QuoteMeta(binPath) + `$`).MatchString(cf) {
		t.Errorf("the Containerfile does not copy the binary to %s", binPath)
	}
	if !regexp.MustCompile(`(?m)^USER 0:0$`).MatchString(cf) {
		t.Error("the Containerfile's USER is not 0:0, releaseimage's is")
	}
}

func TestBadInput(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "nftproxy")
	lic := filepath.Join(dir, "LICENSE")
	for _, p := range []string{bin, lic} {
		if err := os.WriteFile(p, []byte("x"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	out := filepath.Join(dir, "image.tar")
	good := []string{"-o", out, "-ref", "ghcr.io/nftproxy/nftproxy:v0.1.0", "-version", "v0.1.0", "-license", lic}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(good[:len(good):len(good)], "-bin", "linux-amd64="+bin), "want OS/ARCH=PATH"},
		{append(good[:len(good):len(good)], "-bin", "linux/amd64="+filepath.Join(dir, "missing")), "no such file"},
		{append(good[:len(good):len(good)], "-bin", "linux/amd64="+dir), "not a regular file"},
		{append(good[:len(good):len(good)], "-bin", "linux/amd64="+bin, "-bin", "linux/amd64="+bin), "given twice"},
		{append(good[:len(good):len(good)], "-bin", "linux/amd64="+bin, "-created", "yesterday"), "-created"},
		{good, "need -o"},
	} {
		err := run(tc.args)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want an error with %q", tc.args, err, tc.want)
		}
		if _, err := os.Stat(out); err == nil {
			t.Fatalf("%q: wrote %s", tc.args, out)
		}
	}
	if err := run(append(good, "-bin", "linux/amd64="+bin, "-bin", "linux/arm64="+bin, "-created", "1764590400")); err != nil {
		t.Fatal(err)
	}
}
