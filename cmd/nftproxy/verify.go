package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"

	"github.com/nftproxy/nftproxy/internal/controller"
	"github.com/nftproxy/nftproxy/internal/options"
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
	fs, o := options.NewFlagSet()
	wait := fs.Duration("wait", 0, "Keep comparing (listing the API again each second) for up to this long until the kernel matches: the proxy may not have synced the latest changes yet. 0: compare once.")
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: nftproxy verify [flags]\n\n"+
			"Compares nftproxy's tables in the kernel with what the Services, EndpointSlices and\n"+
			"Node in the API compile to, with the proxy's flags (or --config). Prints every\n"+
			"difference, rules and elements in nft syntax as the kernel holds them (a rule\n"+
			"nftproxy never writes by its expressions); exits 0 when equal, 1 when different,\n"+
			"2 on error.\n\n%s", fs.FlagUsages())
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return verifyEqual
		}
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	if fs.NArg() != 0 {
		fmt.Fprintf(stderr, "nftproxy verify: unexpected arguments %q\n", fs.Args())
		return verifyError
	}
	if err := o.Complete(fs); err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	if err := o.Validate(); err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	cfg, err := proxyConfig(o)
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	client, err := newClient(o)
	if err != nil {
		fmt.Fprintln(stderr, "nftproxy verify:", err)
		return verifyError
	}
	ctx, cancel := context.WithTimeout(context.Background(), *wait+2*time.Minute)
	defer cancel()
	return verifyLoop(ctx, client, cfg, readback.Reader{}, *wait, stdout, stderr)
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
