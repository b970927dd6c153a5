package compile

import (
	"flag"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

var update = flag.Bool("update", false, "rewrite testdata/*.nft from the compiler's output")

// TestGolden compares the rendered ruleset of every scenario, in each family, with
// testdata/<scenario>.<family>.nft. Regenerate with
//
//	go test ./internal/compile -run Golden -update
//
// and review the diff: the files document what each scenario compiles to.
func TestGolden(t *testing.T) {
	want := map[string]bool{}
	names := make([]string, 0)
	for name := range scenarios() {
		names = append(names, name)
	}
	for name := range localModeScenarios() {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		for _, fam := range []nft.Family{nft.IPv4, nft.IPv6} {
			file := name + "." + fam.String() + ".nft"
			want[file] = true
			t.Run(name+"/"+fam.String(), func(t *testing.T) {
				snap, cfg := scenarios()[name], configFor(fam)
				if sc, ok := localModeScenarios()[name]; ok { // one per --detect-local-mode
					snap, cfg = sc.snap, sc.config(fam)
				}
				rs, _ := Compile(snap, cfg, NewSlots())
				got := nft.Render(rs)
				path := filepath.Join("testdata", file)
				if *update {
					if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
						t.Fatal(err)
					}
					return
				}
				b, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create it)", err)
				}
				if string(b) != got {
					t.Errorf("%s differs from the compiler's output (run with -update and review the diff):\n%s", path, lineDiff(string(b), got))
				}
			})
		}
	}
	// A golden file without a scenario documents something that no longer exists.
	files, err := filepath.Glob(filepath.Join("testdata", "*.nft"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if base := filepath.Base(f); !want[base] {
			if *update {
				if err := os.Remove(f); err != nil {
					t.Fatal(err)
				}
				continue
			}
			t.Errorf("%s has no scenario (run with -update to remove it)", f)
		}
	}
}

// lineDiff shows the first differing line with some context: enough to locate a change,
// the full diff is what -update and git are for.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	i := 0
	for i < len(w) && i < len(g) && w[i] == g[i] {
		i++
	}
	from := max(i-3, 0)
	var b strings.Builder
	for j := from; j < i; j++ {
		b.WriteString("  " + w[j] + "\n")
	}
	for j := i; j < min(i+3, len(w)); j++ {
		b.WriteString("- " + w[j] + "\n")
	}
	for j := i; j < min(i+3, len(g)); j++ {
		b.WriteString("+ " + g[j] + "\n")
	}
	return b.String()
}
