package controller_test

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/pipeline"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
)

// kernelGroups is how many throwaway namespaces the corpus is spread over. Within one,
// the seeds are applied one after another by one Applier with one set of slot
// allocators, like the syncs of a long-running proxy: every seed after the first is a
// diff against the previous one.
const kernelGroups = 3

// TestFuzzCorpusKernel applies every state of every input in the fuzz corpus
// (testdata/fuzz/*) to the kernel over netlink, in throwaway network namespaces. After
// each input's final state, "nft list ruleset" run inside the namespace must list both
// tables with exactly the chains and sets written, and the rendered text must pass
// "nft -c" (the renderer's promise that its output loads with "nft -f").
func TestFuzzCorpusKernel(t *testing.T) {
	inputs := corpus(t)
	for g := range kernelGroups {
		t.Run(fmt.Sprintf("group-%d", g), func(t *testing.T) {
			ns := testnetns.New(t)
			// "nft -c" of a table that already exists fails in nft 1.0.6 even for text nft
			// loaded itself ("conflicting protocols specified: tcp vs. th"), so the
			// rendered text is checked in a namespace that stays empty.
			empty := testnetns.New(t)
			applier := kernel.New(kernel.WithNetNS(ns.FD))
			slots := map[nft.Family]*compile.Slots{}
			var last []*nft.Ruleset
			for i := g; i < len(inputs); i += kernelGroups {
				in := inputs[i]
				worlds := decode(in.data)
				for step, w := range worlds {
					_, rulesets, _, err := pipeline.Compile(w.cfg.Pipeline, slots, w.svcs, w.slices, w.node)
					if err != nil {
						continue // a rejected configuration (FuzzCompile checks when)
					}
					last = rulesets
					if _, err := applier.Apply(rulesets...); err != nil {
						t.Fatalf("%s, sync %d: netlink apply: %v\n%s", in.name, step, err, describe(w))
					}
					if step < len(worlds)-1 {
						continue // intermediate states are applied, only the final one is listed
					}
					listed(t, ns, in.name, step, rulesets)
					var text strings.Builder
					for _, rs := range rulesets {
						text.WriteString(nft.Render(rs))
					}
					if out, err := empty.Run(t, text.String(), "nft", "-c", "-f", "-"); err != nil {
						t.Errorf("%s: nft -c rejects the rendered ruleset: %v\n%s", in.name, err, out)
					}
				}
			}
			if last == nil {
				return
			}
			// The periodic full rewrite of what is there.
			applier.Resync()
			if _, err := applier.Apply(last...); err != nil {
				t.Fatalf("full rewrite: %v", err)
			}
			listed(t, ns, "full rewrite", 0, last)
		})
	}
}

type corpusInput struct {
	name string
	data []byte
}

// corpus reads the inputs of every fuzz target's corpus, each distinct input once.
func corpus(t *testing.T) []corpusInput {
	t.Helper()
	var out []corpusInput
	seen := map[[32]byte]bool{}
	for _, target := range fuzzTargets {
		dir := filepath.Join("testdata", "fuzz", target)
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			content, err := os.ReadFile(filepath.Join(dir, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			data, err := readCorpusFile(content)
			if err != nil {
				t.Fatalf("%s/%s: %v", dir, e.Name(), err)
			}
			if h := sha256.Sum256(data); !seen[h] {
				seen[h] = true
				out = append(out, corpusInput{target + "/" + e.Name(), data})
			}
		}
	}
	if len(out) < 20 {
		t.Fatalf("only %d corpus inputs", len(out))
	}
	return out
}

var (
	tableLine  = regexp.MustCompile(`^table (ip|ip6) (\S+) \{$`)
	objectLine = regexp.MustCompile(`^\t(chain|set|map) (\S+) \{$`)
)

// listed runs "nft list ruleset" in ns and requires it to show every table of rulesets
// with exactly their chains and sets (by name), and nothing else.
func listed(t *testing.T, ns *testnetns.NS, name string, step int, rulesets []*nft.Ruleset) {
	t.Helper()
	out, err := ns.Run(t, "", "nft", "list", "ruleset")
	if err != nil {
		t.Fatalf("%s, sync %d: nft list ruleset: %v\n%s", name, step, err, out)
	}
	got := map[string][]string{} // "ip nftproxy" → "chain x", "set y", …
	table := ""
	for _, l := range strings.Split(out, "\n") {
		if m := tableLine.FindStringSubmatch(l); m != nil {
			table = m[1] + " " + m[2]
			got[table] = []string{}
		} else if m := objectLine.FindStringSubmatch(l); m != nil && table != "" {
			kind := m[1]
			if kind == "map" {
				kind = "set"
			}
			got[table] = append(got[table], kind+" "+strings.Trim(m[2], `"`))
		}
	}
	if len(got) != len(rulesets) {
		t.Errorf("%s, sync %d: nft lists %d tables, want %d\n%s", name, step, len(got), len(rulesets), out)
	}
	for _, rs := range rulesets {
		flat := rs.Flatten()
		var want []string
		for _, c := range flat.Chains {
			want = append(want, "chain "+c.Name)
		}
		for _, s := range flat.Sets {
			want = append(want, "set "+s.Name)
		}
		key := fmt.Sprintf("%s %s", rs.Family, rs.Table)
		have, ok := got[key]
		if !ok {
			t.Errorf("%s, sync %d: nft list ruleset does not list table %s\n%s", name, step, key, out)
			continue
		}
		sort.Strings(want)
		sort.Strings(have)
		if !slices.Equal(want, have) {
			t.Errorf("%s, sync %d: table %s in the kernel differs from the ruleset:\n%s", name, step, key, setDiff(want, have))
		}
	}
}

func setDiff(want, have []string) string {
	var b bytes.Buffer
	for _, w := range want {
		if !slices.Contains(have, w) {
			fmt.Fprintf(&b, "\tmissing: %s\n", w)
		}
	}
	for _, h := range have {
		if !slices.Contains(want, h) {
			fmt.Fprintf(&b, "\tunexpected: %s\n", h)
		}
	}
	return b.String()
}
