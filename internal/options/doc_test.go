package options

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "rewrite the flag table in docs/operations.md")

const (
	docPath   = "../../docs/operations.md"
	beginMark = "<!-- flags:begin (generated from the flag set: go test ./internal/options -run TestOperationsDoc -update) -->"
	endMark   = "<!-- flags:end -->"
)

// flagTable renders the flag set as the markdown that docs/operations.md carries.
func flagTable(fs *pflag.FlagSet) string {
	var b strings.Builder
	b.WriteString("| flag | default | meaning |\n| --- | --- | --- |\n")
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden {
			return
		}
		name := "`--" + f.Name + "`"
		if f.Shorthand != "" {
			name = "`-" + f.Shorthand + "`, " + name
		}
		def := f.DefValue
		if def == "" || def == "[]" {
			def = ""
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", name, def, strings.ReplaceAll(f.Usage, "|", `\|`))
	})
	b.WriteString("\nAccepted for compatibility with kube-proxy, reported once in the log, and without effect: ")
	var names []string
	for _, n := range IgnoredFlags() {
		names = append(names, "`--"+n+"`")
	}
	b.WriteString(strings.Join(names, ", ") + ".\n")
	return b.String()
}

// TestOperationsDoc fails when docs/operations.md's flag table differs from the real
// flag set (a flag added, removed or reworded); -update rewrites it.
func TestOperationsDoc(t *testing.T) {
	fs, _ := NewFlagSet()
	fs.SortFlags = false
	table := flagTable(fs)
	data, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, beginMark), strings.Index(doc, endMark)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the markers %q … %q", docPath, beginMark, endMark)
	}
	current := doc[i+len(beginMark)+1 : j]
	if *update {
		doc = doc[:i+len(beginMark)] + "\n" + table + doc[j:]
		if err := os.WriteFile(docPath, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if current != table {
		t.Errorf("the flag table in %s is out of date; run: go test ./internal/options -run TestOperationsDoc -update", docPath)
	}
	// Every flag, hidden ones included, is named in the document.
	fs.VisitAll(func(f *pflag.Flag) {
		if !strings.Contains(doc, "`--"+f.Name+"`") {
			t.Errorf("--%s is not in %s", f.Name, docPath)
		}
	})
}
