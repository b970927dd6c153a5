package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// runMain runs nftproxy's main in a child process (this test binary, re-executed) with
// args, and returns its exit code and output. No kubeconfig is reachable in the child
// (HOME and KUBECONFIG point nowhere), so a proxy that wrongly started would fail on the
// API client, not program anything.
func runMain(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestMainProcess$")
	cmd.Env = append(os.Environ(), "NFTPROXY_TEST_MAIN_ARGS="+strings.Join(args, "\x1f"),
		"HOME="+t.TempDir(), "KUBECONFIG=", "KUBERNETES_SERVICE_HOST=", "KUBERNETES_SERVICE_PORT=")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

// TestMainProcess is the child of runMain; it does nothing in a normal test run.
func TestMainProcess(t *testing.T) {
	args, ok := os.LookupEnv("NFTPROXY_TEST_MAIN_ARGS")
	if !ok {
		return
	}
	os.Args = append([]string{"nftproxy"}, strings.Split(args, "\x1f")...)
	main()
	os.Exit(0)
}

func TestVersionFlag(t *testing.T) {
	code, out, errs := runMain(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "nftproxy v") || strings.Count(out, "\n") != 1 {
		t.Errorf("--version: code %d stdout %q stderr %q", code, out, errs)
	}
	code, out, _ = runMain(t, "--version=raw")
	if code != 0 || !strings.HasPrefix(out, "version.Info{Major:") || !strings.Contains(out, `GoVersion:"`+runtime.Version()+`"`) {
		t.Errorf("--version=raw: code %d stdout %q", code, out)
	}
	// --version wins over everything else, as kube-proxy's (it is handled right after
	// parsing): even with a flag value that Validate would refuse.
	code, out, _ = runMain(t, "--sync-period=0", "--version")
	if code != 0 || !strings.HasPrefix(out, "nftproxy v") {
		t.Errorf("--version with a bad flag: code %d stdout %q", code, out)
	}
	code, _, errs = runMain(t, "--version=v1.2.3")
	if code != 2 || !strings.Contains(errs, "want true, false or raw") {
		t.Errorf("--version=v1.2.3: code %d stderr %q", code, errs)
	}
	// --version=false runs normally: here it reaches the API client and fails there.
	var buf bytes.Buffer
	fs, o := options.NewFlagSet()
	if code, exit := configure(fs, o, []string{"--version=false"}, &buf); code != 0 || exit {
		t.Errorf("--version=false: code %d exit %v: %s", code, exit, buf.String())
	}
}

func TestUnknownPositionalArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"explian", "--from", "10.0.0.1", "10.96.0.10:53/udp"}, `unknown command "explian": the proxy takes no positional arguments; subcommands are explain, verify, list (did you mean "explain"?)`},
		{[]string{"verfiy"}, `(did you mean "verify"?)`},
		{[]string{"lsit", "-o", "json"}, `(did you mean "list"?)`},
		{[]string{"--hostname-override=n1", "start"}, `unknown command "start"`},
		{[]string{"-v=2", "verify"}, `"verify" must be the first argument`},
	} {
		code, out, errs := runMain(t, tc.args...)
		if code != 2 || !strings.Contains(errs, tc.want) || out != "" {
			t.Errorf("%q: code %d stderr %q stdout %q; want 2 and %q", tc.args, code, errs, out, tc.want)
		}
		// Nothing started: no log line of the proxy.
		if strings.Contains(errs, "Starting nftproxy") || strings.Contains(errs, "nftproxy version") {
			t.Errorf("%q: the proxy started:\n%s", tc.args, errs)
		}
	}
	if s := closest("dance"); s != "" {
		t.Errorf("closest(dance) = %q", s)
	}
	code, _, errs := runMain(t, "dance")
	if code != 2 || strings.Contains(errs, "did you mean") {
		t.Errorf("dance: code %d stderr %q", code, errs)
	}
}

func TestCheckKernel(t *testing.T) {
	for _, env := range kernelCheckSkipEnv {
		t.Setenv(env, "")
	}
	release := func(s string) func() (kernel.Release, error) {
		return func() (kernel.Release, error) { return kernel.ParseRelease(s) }
	}
	log, buf := testLogger(t)
	err := checkKernel(log, release("4.18.0-553.el8_10.x86_64"))
	if err == nil || !strings.Contains(err.Error(), "4.18.0-553.el8_10.x86_64 is older than 5.7") || !strings.Contains(err.Error(), "NFTPROXY_SKIP_KERNEL_VERSION_CHECK=1") {
		t.Errorf("4.18: %v", err)
	}
	if err := checkKernel(log, func() (kernel.Release, error) { return kernel.Release{}, errors.New("no uname") }); err == nil {
		t.Error("an unknown kernel passed the check")
	}
	buf.Reset()
	if err := checkKernel(log, release("5.10.0-32-amd64")); err != nil || !strings.Contains(buf.String(), "older than 5.13") {
		t.Errorf("5.10: err %v log %q", err, buf.String())
	}
	buf.Reset()
	if err := checkKernel(log, release("6.1.0")); err != nil || buf.Len() != 0 {
		t.Errorf("6.1: err %v log %q", err, buf.String())
	}
	for _, env := range kernelCheckSkipEnv {
		t.Setenv(env, "1")
		if err := checkKernel(log, release("4.18.0")); err != nil {
			t.Errorf("%s=1: %v", env, err)
		}
		t.Setenv(env, "")
	}
}

func TestLogVersion(t *testing.T) {
	log, buf := testLogger(t)
	logVersion(log, func() (kernel.Release, error) { return kernel.ParseRelease("4.10.1-test") })
	out := buf.String()
	for _, want := range []string{`"nftproxy version"`, ` version="v`, ` goVersion="` + runtime.Version() + `"`, ` kernel="4.10.1-test"`,
		` nftablesFeatures=["nf_tables","meta-l4proto","rule-comments","set-ids","masquerade","concatenations","set-timeouts","set-comments","numgen","fib"]`} {
		if !strings.Contains(out, want) {
			t.Errorf("startup line lacks %s:\n%s", want, out)
		}
	}
}
