package main

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/nftproxy/nftproxy/internal/options"
)

// `nftproxy --help` names every subcommand before the proxy's flags.
func TestProxyHelpListsSubcommands(t *testing.T) {
	var stderr bytes.Buffer
	fs, o := options.NewFlagSet()
	if code, exit := configure(fs, o, []string{"--help"}, &stderr); code != 0 || !exit {
		t.Fatalf("--help: code %d exit %v", code, exit)
	}
	out := stderr.String()
	flags := strings.Index(out, "\nFlags:\n")
	if flags < 0 || !strings.Contains(out[flags:], "--kubeconfig") || !strings.Contains(out[flags:], "--version") {
		t.Fatalf("no proxy flags section:\n%s", out)
	}
	for _, name := range []string{"explain", "verify", "list"} {
		i := strings.Index(out, "\n  "+name+" ")
		if i < 0 || i > flags {
			t.Errorf("%s is not listed among the commands before the flags:\n%s", name, out[:flags])
		}
	}
}

// Each subcommand's --help shows its own flags first, then the proxy flags it shares
// (explain, verify) or none (list).
func TestSubcommandHelpOwnFlagsFirst(t *testing.T) {
	for _, tc := range []struct {
		name   string
		run    func(w *bytes.Buffer) error
		own    []string
		shared bool
	}{
		{"explain", func(w *bytes.Buffer) error { _, err := parseExplain([]string{"--help"}, w); return err },
			[]string{"--from", "--local", "--rules"}, true},
		{"verify", func(w *bytes.Buffer) error {
			if o, _, _, code := verifySettings([]string{"--help"}, w); o != nil || code != 0 {
				return errors.New("verify --help did not stop with exit 0")
			}
			return pflag.ErrHelp
		}, []string{"--wait", "--from-configz"}, true},
		{"list", func(w *bytes.Buffer) error {
			if code := listCommand([]string{"--help"}, nil, w, w); code != 0 {
				return errors.New("list --help did not exit 0")
			}
			return pflag.ErrHelp
		}, []string{"--output"}, false},
	} {
		var w bytes.Buffer
		if err := tc.run(&w); !errors.Is(err, pflag.ErrHelp) {
			t.Errorf("%s --help: %v", tc.name, err)
			continue
		}
		out := w.String()
		if !strings.HasPrefix(out, "usage: nftproxy "+tc.name) {
			t.Errorf("%s --help does not start with its usage line:\n%.200s", tc.name, out)
		}
		shared := strings.Index(out, "\nProxy flags")
		if !tc.shared {
			if shared >= 0 || strings.Contains(out, "--kubeconfig") {
				t.Errorf("%s --help lists proxy flags it does not take:\n%s", tc.name, out)
			}
			shared = len(out)
		} else if shared < 0 || !strings.Contains(out[shared:], "--kubeconfig") || !strings.Contains(out[shared:], "--cluster-cidr") {
			t.Errorf("%s --help has no section of shared proxy flags:\n%s", tc.name, out)
			continue
		}
		firstFlag := strings.Index(out, "\n  ")
		for _, f := range tc.own {
			i := strings.Index(out, f+" ")
			if i < 0 || i > shared || strings.Contains(out[shared:], f+" ") {
				t.Errorf("%s --help: own flag %s not (only) before the proxy flags", tc.name, f)
			}
		}
		if tc.shared && strings.Contains(out[firstFlag:shared], "--kubeconfig") {
			t.Errorf("%s --help: a proxy flag among its own flags:\n%s", tc.name, out[:shared])
		}
	}
}
