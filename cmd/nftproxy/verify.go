package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/kube-proxy/config/v1alpha1"

	"github.com/nftproxy/nftproxy/internal/config"
	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/inspect"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/serve"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
)

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
		return inspect.VerifyError
	}
	applier := kernel.New()
	defer applier.Close()
	withoutUnavailableFastPath(&cfg, applier.ProbeFlowtables, stderr)
	ctx, cancel := context.WithTimeout(context.Background(), wait+2*time.Minute)
	defer cancel()
	return verifyLoop(ctx, client, cfg, readback.Reader{}, wait, stdout, stderr)
}

// withoutUnavailableFastPath turns --fast-path-interfaces off in cfg when the kernel
// refuses flowtables (probe: kernel.Applier.ProbeFlowtables), as the proxy does on
// such a kernel, so that verify compares with what the proxy programs there.
func withoutUnavailableFastPath(cfg *controller.Config, probe func(nft.Family) error, stderr io.Writer) {
	if len(cfg.Pipeline.FastPathInterfaces) == 0 {
		return
	}
	for _, fam := range pipeline.Families {
		if err := probe(fam); err != nil {
			fmt.Fprintf(stderr, "nftproxy verify: the kernel refuses flowtables (%v); comparing without the fast path, as the proxy programs it on this kernel\n", err)
			cfg.Pipeline.FastPathInterfaces = nil
			return
		}
	}
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
			return nil, none, 0, inspect.VerifyEqual
		}
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, inspect.VerifyError
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftproxy verify: unexpected arguments %q\n", fs.Args())
		return nil, none, 0, inspect.VerifyError
	}
	switch {
	case *fromProxy && fs.Changed("config"):
		fmt.Fprintln(stderr, "nftproxy verify: --from-configz and --config: give one of them")
		return nil, none, 0, inspect.VerifyError
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
		return nil, none, 0, inspect.VerifyError
	}
	if fs.Changed("kubeconfig") {
		o.Kubeconfig = kubeconfig
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, inspect.VerifyError
	}
	cfg, err := proxyConfig(o, localAddrs)
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return nil, none, 0, inspect.VerifyError
	}
	return o, cfg, *wait, 0
}

// verifyLoop compares until equal or until wait has passed, then reports.
func verifyLoop(ctx context.Context, client kubernetes.Interface, cfg controller.Config, v inspect.Verifier, wait time.Duration, stdout, stderr io.Writer) int {
	res, err := inspect.Until(ctx, wait, func(ctx context.Context) (inspect.Result, error) { return verifyOnce(ctx, client, cfg, v) })
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return inspect.VerifyError
	}
	return res.Report(stdout)
}

// verifyOnce lists the API, compiles like the proxy and compares every family's table.
func verifyOnce(ctx context.Context, client kubernetes.Interface, cfg controller.Config, v inspect.Verifier) (inspect.Result, error) {
	state, err := listAPI(ctx, client, cfg.NodeName)
	if err != nil {
		return inspect.Result{}, err
	}
	snap, rulesets, _, err := state.compile(cfg)
	if err != nil {
		return inspect.Result{}, err
	}
	return inspect.Compare(v, rulesets, len(snap.Services))
}

// configzTimeout bounds the request for the running proxy's /configz.
const configzTimeout = 5 * time.Second

// proxySettings reads the running proxy's settings from /configz on
// --metrics-bind-address, writes the settings given on verify's command line over them
// (see inspect.Overlay) and makes the result o's configuration file for Complete: whatever the
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
	url := "http://" + inspect.Dialable(addr) + "/configz"
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
	c, err = inspect.Overlay(c, o.EffectiveConfig(), defaults.EffectiveConfig())
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
