package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"

	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/inspect"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/nft/readback"
)

// nftproxy list shows what is programmed, read from the kernel's tables, not what the API
// says should be (internal/inspect). It needs no API access and no flags.

// runList implements "nftproxy list [-o text|json]".
func runList(args []string, stdout, stderr io.Writer) int {
	return listCommand(args, readback.Reader{}, stdout, stderr)
}

func listCommand(args []string, r inspect.TableReader, stdout, stderr io.Writer) int {
	fs := pflag.NewFlagSet("nftproxy list", pflag.ContinueOnError)
	output := fs.StringP("output", "o", "text", "Output format: text (an aligned table) or json.")
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: nftproxy list [flags]\n\n"+
			"Lists every service port programmed in nftproxy's tables in the kernel (the ip and\n"+
			"ip6 tables \"nftproxy\"): its frontends (cluster IPs, external and load-balancer\n"+
			"IPs, node ports) and the endpoints each leads to with the probability of being\n"+
			"picked, the traffic policy and the session affinity. Needs no kubeconfig; needs\n"+
			"CAP_NET_ADMIN in the node's network namespace. Exits 1 when no table is found.\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return 0
		}
		fmt.Fprintln(stderr, "nftproxy list:", err)
		return 2
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftproxy list: unexpected arguments %q\n", fs.Args())
		return 2
	}
	if *output != "text" && *output != "json" {
		fmt.Fprintf(stderr, "nftproxy list: --output %q: want text or json\n", *output)
		return 2
	}
	l, err := inspect.List(r, pipeline.Families, interfaceAddrs)
	for _, s := range l.Ignored {
		fmt.Fprintln(stderr, "nftproxy list:", s)
	}
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy list:", err)
		return 2
	}
	if l.Tables == 0 {
		fmt.Fprintf(stderr, "nftproxy list: no %s table in the kernel (is nftproxy running on this node, in this network namespace?)\n", compile.TableName)
		return 1
	}
	if *output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		all := l.Ports
		if all == nil {
			all = []inspect.Port{}
		}
		if err := enc.Encode(all); err != nil {
			fmt.Fprintln(stderr, "nftproxy list:", err)
			return 2
		}
		return 0
	}
	if err := inspect.WriteTable(stdout, l.Ports); err != nil {
		fmt.Fprintln(stderr, "nftproxy list:", err)
		return 2
	}
	return 0
}

// interfaceAddrs returns the node's addresses, for a table whose node ports answer on
// every local address ("fib daddr type local"); list runs in the node's namespace.
func interfaceAddrs() []netip.Addr {
	ifAddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	var out []netip.Addr
	for _, a := range ifAddrs {
		if p, err := netip.ParsePrefix(a.String()); err == nil {
			out = append(out, p.Addr().Unmap())
		}
	}
	return out
}
