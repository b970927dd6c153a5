package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/internal/serve"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/readback"
)

// Exit codes of nftproxy verify.
const (
	verifyEqual     = 0
	verifyDifferent = 1
	verifyError     = 2
)

// verifier reads the kernel back and compares (readback.Reader; a fake in tests).
type verifier interface {
	Verify(expected *nft.Ruleset, opts ...readback.Option) (readback.Diff, error)
}

// slotsByContent compares the compiler's endpoint slot maps by what each service's
// rule selects from them, not by slot number: the proxy's slot numbers depend on the
// order in which services came and went (compile.Slots), which a fresh compile cannot
// know.
var slotsByContent = readback.MapsByContent(isEndpointSlotMap)

// isEndpointSlotMap recognises compile's endpoint slot maps: the only maps keyed by a
// numgen integer (slot → endpoint address . port).
func isEndpointSlotMap(s *nft.Set) bool {
	return s.IsMap() && len(s.Key) == 1 && s.Key[0] == nft.TypeNumgen
}

// runVerify implements "nftproxy verify [flags]": list the API once, compile exactly as
// the proxy does with the same flags, read nftproxy's tables back from the kernel and
// print every difference. Exit 0 when equal, 1 when different, 2 on error.
func runVerify(args []string, stdout, stderr io.Writer) int {
	o, cfg, wait, code := verifySettings(args, stderr)
	if o == nil {
		return code
	}
	client, err := newClient(o)
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait+2*time.Minute)
	defer cancel()
	return verifyLoop(ctx, client, cfg, readback.Reader{}, wait, stdout, stderr)
}

// verifySettings parses verify's command line into the reference settings: --config or
// the flags given, or with --from-configz the running proxy's /configz (see
// proxySettings). It returns the options, the controller configuration and --wait.
// On --help or an error it returns nil options and the exit code.
func verifySettings(args []string, stderr io.Writer) (*options.Options, controller.Config, time.Duration, int) {
	var none controller.Config
	fs, o := options.NewFlagSet()
	wait := fs.Duration("wait", 0, "Keep comparing (listing the API again each second) for up to this long until the kernel matches: the proxy may not have synced the latest changes yet. 0: compare once.")
	fromProxy := fs.Bool("from-configz", false, "Take the reference settings from /configz on --metrics-bind-address (default 127.0.0.1:10249) instead of repeating the proxy's flags; flags given here override them. Not with --config. /configz is unauthenticated: whatever process serves that port decides what the kernel is compared with. Prefer --config with the proxy's own file.")
	fs.SetOutput(stderr)
	fs.Usage = func() {
		subcommandUsage(stderr, "usage: nftproxy verify [flags]\n\n"+
			"Compares nftproxy's tables in the kernel with what the Services, EndpointSlices and\n"+
			"Node in the API compile to, with the settings given here: --config (the proxy's\n"+
			"own file, as in the DaemonSet's container) or flags, as the proxy reads them,\n"+
			"except --kubeconfig, which verify always uses as given (--from-configz reads\n"+
			"them from the running proxy's unauthenticated /configz instead). Prints every\n"+
			"difference, rules and elements in nft syntax as the kernel holds them (a rule\n"+
			"nftproxy never writes by its expressions); exits 0 when equal, 1 when different,\n"+
			"2 on error.\n", fs, "wait", "from-configz")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil, none, 0, verifyEqual
		}
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, verifyError
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftproxy verify: unexpected arguments %q\n", fs.Args())
		return nil, none, 0, verifyError
	}
	switch {
	case *fromProxy && fs.Changed("config"):
		fmt.Fprintln(stderr, "nftproxy verify: --from-configz and --config: give one of them")
		return nil, none, 0, verifyError
	case *fromProxy:
		defer proxySettings(o, stderr)()
	case fs.Changed("config"):
		fmt.Fprintf(stderr, "nftproxy verify: comparing with the settings of --config %s\n", o.ConfigFile)
	default:
		fmt.Fprintln(stderr, "nftproxy verify: comparing with the flags given here (kube-proxy's defaults for the rest); give the proxy's --config for its settings")
	}
	// verify talks to the API as whoever runs it: a --kubeconfig given here is used even
	// with --config, whose clientConnection.kubeconfig is the proxy pod's path.
	kubeconfig := o.Kubeconfig
	if err := o.Complete(fs); err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, verifyError
	}
	if fs.Changed("kubeconfig") {
		o.Kubeconfig = kubeconfig
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, verifyError
	}
	cfg, err := proxyConfig(o, localAddrs)
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, verifyError
	}
	return o, cfg, *wait, 0
}

// verifyLoop compares until equal or until wait has passed, then reports.
func verifyLoop(ctx context.Context, client kubernetes.Interface, cfg controller.Config, v verifier, wait time.Duration, stdout, stderr io.Writer) int {
	deadline := time.Now().Add(wait)
	for attempt := 1; ; attempt++ {
		res, err := verifyOnce(ctx, client, cfg, v)
		if err != nil {
			fmt.Fprintln(stderr, "nftproxy verify:", err)
			return verifyError
		}
		if res.diff.Empty() || !time.Now().Add(time.Second).Before(deadline) {
			res.attempts = attempt
			return res.report(stdout)
		}
		select {
		case <-ctx.Done():
			fmt.Fprintln(stderr, "nftproxy verify:", ctx.Err())
			return verifyError
		case <-time.After(time.Second):
		}
	}
}

// verifyResult is one comparison of the kernel with the API.
type verifyResult struct {
	tables       []string // "ip nftproxy", …
	servicePorts int
	diff         readback.Diff
	attempts     int
}

// verifyOnce lists the API, compiles like the proxy and compares every family's table.
// Endpoint slots are compared by content: the proxy's slot numbers depend on the order
// in which services came and went (compile.Slots), which a fresh compile cannot know.
func verifyOnce(ctx context.Context, client kubernetes.Interface, cfg controller.Config, v verifier) (verifyResult, error) {
	var res verifyResult
	state, err := listAPI(ctx, client, cfg.NodeName)
	if err != nil {
		return res, err
	}
	snap, rulesets, _, err := state.compile(cfg)
	if err != nil {
		return res, err
	}
	res.servicePorts = len(snap.Services)
	for _, rs := range rulesets {
		d, err := v.Verify(rs, slotsByContent)
		if err != nil {
			return res, fmt.Errorf("reading %s %s back from the kernel: %w", rs.Family, rs.Table, err)
		}
		res.tables = append(res.tables, fmt.Sprintf("%s %s", rs.Family, rs.Table))
		res.diff = append(res.diff, d...)
	}
	return res, nil
}

// report prints the result and returns the exit code.
func (r verifyResult) report(w io.Writer) int {
	tries := ""
	if r.attempts > 1 {
		tries = fmt.Sprintf(" (after %d comparisons)", r.attempts)
	}
	if r.diff.Empty() {
		fmt.Fprintf(w, "equal: the kernel's tables %s match the API's %d service ports%s\n", strings.Join(r.tables, ", "), r.servicePorts, tries)
		return verifyEqual
	}
	for _, l := range r.diff {
		fmt.Fprintln(w, l)
	}
	fmt.Fprintf(w, "different: %d differences between the kernel's tables %s and the API's %d service ports%s\n", len(r.diff), strings.Join(r.tables, ", "), r.servicePorts, tries)
	return verifyDifferent
}

// configzTimeout bounds the request for the running proxy's /configz.
const configzTimeout = 5 * time.Second

// proxySettings reads the running proxy's settings from /configz on
// --metrics-bind-address, writes the settings given on verify's command line over them
// (see overlay) and makes the result o's configuration file for Complete: whatever the
// precedence of flags and file, the flags given win. The API client and logging
// settings are verify's own: the proxy's kubeconfig path is the pod's, not the
// operator's. When /configz cannot be read, it says so and the flags alone count. Call
// it after fs.Parse and before Complete; the returned function removes the temporary
// file.
func proxySettings(o *options.Options, stderr io.Writer) (cleanup func()) {
	cleanup = func() {}
	addr := config.AppendPortIfNeeded(o.MetricsBindAddress, config.MetricsPort)
	if addr == "" {
		fmt.Fprintln(stderr, "nftproxy verify: no --metrics-bind-address: comparing with the flags given alone")
		return cleanup
	}
	url := "http://" + dialable(addr) + "/configz"
	// nothing authenticates the answer: a process that holds the port (the proxy
	// restarting, or any other on the node) can serve settings under which a tampered
	// kernel compares equal
	fmt.Fprintf(stderr, "nftproxy verify: warning: %s is unauthenticated: the comparison is only as good as whatever serves it; prefer --config with the proxy's own file\n", url)
	c, err := fetchConfigz(url)
	if err != nil {
		fmt.Fprintf(stderr, "nftproxy verify: could not read the running proxy's settings (%v); comparing with the flags given alone\n", err)
		return cleanup
	}
	_, defaults := options.NewFlagSet()
	c, err = overlay(c, o.EffectiveConfig(), defaults.EffectiveConfig())
	if err != nil {
		fmt.Fprintf(stderr, "nftproxy verify: merging the running proxy's settings: %v; comparing with the flags given alone\n", err)
		return cleanup
	}
	f, err := os.CreateTemp("", "nftproxy-verify-configz-*.yaml")
	if err != nil {
		fmt.Fprintf(stderr, "nftproxy verify: %v; comparing with the flags given alone\n", err)
		return cleanup
	}
	_ = f.Close()
	cleanup = func() { _ = os.Remove(f.Name()) }
	if err := config.WriteFile(f.Name(), c); err != nil {
		fmt.Fprintf(stderr, "nftproxy verify: %v; comparing with the flags given alone\n", err)
		return cleanup
	}
	o.ConfigFile = f.Name()
	fmt.Fprintf(stderr, "nftproxy verify: using the running proxy's settings from %s (flags given here override them)\n", url)
	return cleanup
}

// overlay writes over the proxy's configuration every setting whose value on verify's
// command line (given) differs from what no flag gives (defaults), and verify's own
// API client and logging settings. Both are compared as JSON, field by field.
func overlay(proxy, given, defaults *v1alpha1.KubeProxyConfiguration) (*v1alpha1.KubeProxyConfiguration, error) {
	var p, g, d map[string]any
	for _, x := range []struct {
		c   *v1alpha1.KubeProxyConfiguration
		out *map[string]any
	}{{proxy, &p}, {given, &g}, {defaults, &d}} {
		b, err := json.Marshal(x.c)
		if err != nil {
			return nil, err
		}
		if err := json.Unmarshal(b, x.out); err != nil {
			return nil, err
		}
	}
	overlayJSON(p, g, d)
	p["clientConnection"], p["logging"] = g["clientConnection"], g["logging"]
	b, err := json.Marshal(p)
	if err != nil {
		return nil, err
	}
	out := &v1alpha1.KubeProxyConfiguration{}
	return out, json.Unmarshal(b, out)
}

func overlayJSON(proxy, given, defaults map[string]any) {
	for k, v := range given {
		if reflect.DeepEqual(v, defaults[k]) {
			continue
		}
		gm, ok1 := v.(map[string]any)
		pm, ok2 := proxy[k].(map[string]any)
		if dm, ok3 := defaults[k].(map[string]any); ok1 && ok2 && ok3 {
			overlayJSON(pm, gm, dm)
			continue
		}
		proxy[k] = v
	}
}

// dialable turns a bind address into one to connect to: an unspecified host (all
// addresses) is reached on loopback.
func dialable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	switch host {
	case "", "0.0.0.0":
		host = "127.0.0.1"
	case "::":
		host = "::1"
	}
	return net.JoinHostPort(host, port)
}

// fetchConfigz reads and checks a proxy's /configz (kube-proxy's shape: the
// KubeProxyConfiguration under "kubeproxy.config.k8s.io").
func fetchConfigz(url string) (*v1alpha1.KubeProxyConfiguration, error) {
	client := &http.Client{Timeout: configzTimeout}
	resp, err := client.Get(url)
	if err != nil {
		return nil, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	var body map[string]json.RawMessage
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&body); err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	raw, ok := body[serve.ConfigzKey]
	if !ok {
		return nil, fmt.Errorf("GET %s: no %q in the answer", url, serve.ConfigzKey)
	}
	f, err := config.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return f.Config, nil
}
