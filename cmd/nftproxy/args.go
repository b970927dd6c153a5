package main

import (
	"fmt"
	"strings"
)

// subcommands are nftproxy's subcommands; each must come first on the command line.
var subcommands = []string{"explain", "verify", "list"}

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
