package main

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/pflag"
)

// commands are nftproxy's subcommands, as `nftproxy --help` lists them; each must come
// first on the command line.
var commands = []struct{ name, summary string }{
	{"explain", "what the rules do with a new connection to ip:port (from the API)"},
	{"verify", "compare the tables in the kernel with what the API compiles to"},
	{"list", "list the service ports in the kernel and their endpoints"},
}

// subcommands are the commands' names.
var subcommands = func() []string {
	var names []string
	for _, c := range commands {
		names = append(names, c.name)
	}
	return names
}()

// proxyUsage is `nftproxy --help`: how to run the proxy, the subcommands, then the
// proxy's flags.
func proxyUsage(w io.Writer, fs *pflag.FlagSet) {
	var b strings.Builder
	b.WriteString("usage: nftproxy [flags]             run the service proxy (kube-proxy's flags)\n" +
		"       nftproxy COMMAND [flags]     run a command\n\n" +
		"nftproxy programs a node's nftables over netlink for the Kubernetes Services it\n" +
		"watches, as kube-proxy does; see docs/operations.md.\n\nCommands:\n")
	for _, c := range commands {
		fmt.Fprintf(&b, "  %-9s %s\n", c.name, c.summary)
	}
	b.WriteString("\nRun 'nftproxy COMMAND --help' for a command's flags.\n\nFlags:\n")
	b.WriteString(fs.FlagUsages())
	io.WriteString(w, b.String())
}

// subcommandUsage prints a subcommand's usage: head (its synopsis and description), its
// own flags (those named in own), then the proxy flags it shares, which set how the
// rules are compiled and where the API is, as for the proxy.
func subcommandUsage(w io.Writer, head string, fs *pflag.FlagSet, own ...string) {
	mine := pflag.NewFlagSet("own", pflag.ContinueOnError)
	shared := pflag.NewFlagSet("shared", pflag.ContinueOnError)
	mine.SortFlags, shared.SortFlags = false, false
	fs.VisitAll(func(f *pflag.Flag) {
		if slices.Contains(own, f.Name) {
			mine.AddFlag(f)
		} else {
			shared.AddFlag(f)
		}
	})
	io.WriteString(w, head+"\nFlags:\n"+mine.FlagUsages()+
		"\nProxy flags (the same as the proxy's, for the same compiled rules):\n"+shared.FlagUsages())
}

// checkArgs refuses positional arguments: the proxy takes none, so one is a mistyped
// subcommand (nftproxy explian …) or a subcommand after flags, and starting the proxy
// (which programs the node) would be the wrong thing to do.
func checkArgs(args []string) error {
	if len(args) == 0 {
		return nil
	}
	known := strings.Join(subcommands, ", ")
	for _, s := range subcommands {
		if args[0] == s {
			return fmt.Errorf("%q must be the first argument (nftproxy %s [flags]); the proxy itself takes no positional arguments", s, s)
		}
	}
	msg := fmt.Sprintf("unknown command %q: the proxy takes no positional arguments; subcommands are %s", args[0], known)
	if s := closest(args[0]); s != "" {
		msg += fmt.Sprintf(" (did you mean %q?)", s)
	}
	return fmt.Errorf("%s", msg)
}

// closest returns the subcommand within edit distance 2 of s, if any.
func closest(s string) string {
	best, bestD := "", 3
	for _, c := range subcommands {
		if d := editDistance(s, c); d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance, counting a swap of two neighbours as one.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}
