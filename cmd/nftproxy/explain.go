package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/inspect"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/options"
	"github.com/nftproxy/nftproxy/nft"
)

// explainRequest is a parsed "nftproxy explain" command line.
type explainRequest struct {
	opts *options.Options // the proxy's flags (and --config)
	q    inspect.Question
}

// runExplain implements "nftproxy explain [flags] DEST": what the dataplane does with the
// first packet of a connection to DEST, computed from the API like --dry-run. It returns
// the exit code.
func runExplain(args []string) int {
	req, err := parseExplain(args, os.Stderr)
	if errors.Is(err, pflag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy explain:", err)
		return 2
	}
	client, err := newClient(req.opts)
	if err == nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		err = explain(ctx, client, req, os.Stdout)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "nftproxy explain:", err)
		return 1
	}
	return 0
}

// parseExplain parses explain's command line: the proxy's flags, explain's own and DEST.
func parseExplain(args []string, stderr io.Writer) (*explainRequest, error) {
	fs, o := options.NewFlagSet()
	req := &explainRequest{opts: o}
	fs.StringVar(&req.q.From, "from", "", "Client address. Default: a pod (an address in --cluster-cidr), or the node with --local.")
	fs.BoolVar(&req.q.Local, "local", false, "The packet is sent by a process on the node (hook output) instead of arriving from the network.")
	fs.BoolVar(&req.q.Rules, "rules", false, "Also print the rules each packet goes through.")
	fs.SetOutput(stderr)
	fs.Usage = func() {
		subcommandUsage(stderr, "usage: nftproxy explain [flags] ip:port[/tcp|udp|sctp]\n\n"+
			"Explains what nftproxy's rules do with a new connection to the destination, from the\n"+
			"Services, EndpointSlices and Node in the API. It takes the proxy's flags.\n", fs, "from", "local", "rules")
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return nil, fmt.Errorf("expected one destination, got %d arguments", fs.NArg())
	}
	var err error
	if req.q.Dest, req.q.Proto, err = inspect.ParseDest(fs.Arg(0)); err != nil {
		return nil, err
	}
	if err := o.Complete(fs); err != nil { // --config, as the proxy reads it
		return nil, err
	}
	return req, o.Validate()
}

// explain builds the rulesets from the API, traces the packet and writes the explanation.
func explain(ctx context.Context, client kubernetes.Interface, req *explainRequest, w io.Writer) error {
	in, err := fromAPI(ctx, client, req.opts)
	if err != nil {
		return err
	}
	return inspect.Explain(w, req.q, inspect.Compiled{Snapshot: in.snap, Rulesets: in.rulesets, Problems: in.problems,
		DetectLocal: in.cfg.Pipeline.Compile.DetectLocal, NoExternalIPs: in.cfg.Pipeline.Compile.NoExternalIPs})
}

// explained is what explain traces: the proxy's configuration and what it compiles.
type explained struct {
	cfg      controller.Config
	snap     *model.Snapshot
	rulesets []*nft.Ruleset
	problems []model.Problem
}

// fromAPI lists the API once and compiles the rulesets with the proxy's configuration
// (proxyConfig), like --dry-run.
func fromAPI(ctx context.Context, client kubernetes.Interface, o *options.Options) (explained, error) {
	nodeName, err := o.NodeName()
	if err != nil {
		return explained{}, err
	}
	state, err := listAPI(ctx, client, nodeName)
	if err != nil {
		return explained{}, err
	}
	if state.node == nil {
		fmt.Fprintf(os.Stderr, "nftproxy explain: no node %q; explaining without node addresses (see --hostname-override)\n", nodeName)
	}
	// The machine running explain need not be the node: the node's addresses, among
	// which --nodeport-addresses ranges select, are those of its Node object.
	nodeIPs := model.NodeOf(state.node).IPs
	in := explained{}
	if in.cfg, err = proxyConfig(o, func() ([]netip.Addr, error) { return nodeIPs, nil }); err != nil {
		return explained{}, err
	}
	in.snap, in.rulesets, in.problems, err = state.compile(in.cfg)
	return in, err
}
