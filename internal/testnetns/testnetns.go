// Package testnetns gives tests a throwaway network namespace, so that nothing a test
// programs ever touches the machine's own namespace.
package testnetns

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// NS is a named network namespace created for one test.
type NS struct {
	Name string
	FD   int // open file descriptor of the namespace
}

// Required reports whether kernel tests must run (NFTPROXY_KERNEL_TESTS=1, as in CI):
// then missing privileges or tools fail the test instead of skipping it.
func Required() bool { return os.Getenv("NFTPROXY_KERNEL_TESTS") == "1" }

// New creates a namespace that is deleted when the test ends. Without root or the ip and
// nft tools the test is skipped, or failed when kernel tests are required.
func New(t testing.TB) *NS {
	t.Helper()
	missing := ""
	if os.Geteuid() != 0 {
		missing = "root"
	}
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = tool
		}
	}
	if missing != "" {
		if Required() {
			t.Fatalf("kernel test needs %s", missing)
		}
		t.Skipf("kernel test needs %s (set NFTPROXY_KERNEL_TESTS=1 to require it)", missing)
	}
	var rnd [4]byte
	_, _ = rand.Read(rnd[:])
	name := "nptest-" + hex.EncodeToString(rnd[:])
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	f, err := os.Open("/run/netns/" + name)
	if err != nil {
		_ = exec.Command("ip", "netns", "del", name).Run()
		t.Fatalf("opening netns: %v", err)
	}
	ns := &NS{Name: name, FD: int(f.Fd())}
	t.Cleanup(func() {
		f.Close()
		if out, err := exec.Command("ip", "netns", "del", name).CombinedOutput(); err != nil {
			t.Errorf("ip netns del %s: %v: %s", name, err, out)
		}
	})
	return ns
}

// Run runs a command inside the namespace and returns its combined output.
func (ns *NS) Run(t testing.TB, stdin string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("ip", append([]string{"netns", "exec", ns.Name}, args...)...)
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// MustRun is Run that fails the test on error.
func (ns *NS) MustRun(t testing.TB, stdin string, args ...string) string {
	t.Helper()
	out, err := ns.Run(t, stdin, args...)
	if err != nil {
		t.Fatalf("%v in %s: %v\n%s", args, ns.Name, err, out)
	}
	return out
}
