// Command promqlcheck checks that every PromQL expression of Grafana dashboards and
// Prometheus rules files selects only metrics a program exports: it parses each
// expression with Prometheus' own parser (github.com/prometheus/prometheus/promql/parser)
// and looks up the metric name of every selector in a list of exported series names.
//
//	promqlcheck -metrics names.txt dashboard.json rules.yaml ...
//
// names.txt holds one series name a line (histograms as name_bucket, name_sum,
// name_count). A dashboard's expressions are its panels' targets[].expr and its query
// variables (label_values(selector, label) is checked as its selector); Grafana's
// variables are replaced by values that parse ($__rate_interval by 5m, other $vars by a
// matching regexp). A rules file's are groups[].rules[].expr. A selector without a
// metric name is an error: it could match anything. Exit status 1 lists each problem.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"go.yaml.in/yaml/v3"
)

func main() {
	metricsFile := flag.String("metrics", "", "file with the exported series names, one a line")
	flag.Parse()
	if *metricsFile == "" || flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: promqlcheck -metrics names.txt FILE.json|FILE.yaml ...")
		os.Exit(2)
	}
	known, err := readNames(*metricsFile)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	problems, checked := 0, 0
	used := map[string]bool{}
	for _, f := range flag.Args() {
		exprs, err := expressions(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		if len(exprs) == 0 {
			fmt.Printf("%s: no expression found\n", f)
			problems++
		}
		for _, e := range exprs {
			names, err := selectorNames(e.expr)
			checked++
			if err != nil {
				fmt.Printf("%s: %s: %v\n", f, e.where, err)
				problems++
				continue
			}
			for _, n := range names {
				used[n] = true
				if !known[n] {
					fmt.Printf("%s: %s: metric %s is not exported\n", f, e.where, n)
					problems++
				}
			}
		}
	}
	var all []string
	for n := range used {
		all = append(all, n)
	}
	sort.Strings(all)
	fmt.Printf("%d expressions, %d metrics: %s\n", checked, len(all), strings.Join(all, " "))
	if problems > 0 {
		fmt.Printf("%d problems\n", problems)
		os.Exit(1)
	}
}

func readNames(path string) (map[string]bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	names := map[string]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if n := strings.TrimSpace(sc.Text()); n != "" {
			names[n] = true
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%s: no metric names", path)
	}
	return names, sc.Err()
}

type located struct{ where, expr string }

func expressions(path string) ([]located, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	if strings.HasSuffix(path, ".json") {
		return dashboardExprs(data)
	}
	return ruleExprs(data)
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var labelValues = regexp.MustCompile(`^\s*label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\s*\)\s*$`)

func dashboardExprs(data []byte) ([]located, error) {
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, err
	}
	var out []located
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				if t.Expr != "" {
					out = append(out, located{fmt.Sprintf("panel %q target %s", p.Title, t.RefID), grafanaVars(t.Expr)})
				}
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q string
		var obj struct {
			Query string `json:"query"`
		}
		if json.Unmarshal(v.Query, &q) != nil {
			if err := json.Unmarshal(v.Query, &obj); err != nil {
				return nil, fmt.Errorf("variable %s: query: %v", v.Name, err)
			}
			q = obj.Query
		}
		if m := labelValues.FindStringSubmatch(q); m != nil {
			q = m[1]
		}
		out = append(out, located{fmt.Sprintf("variable %s", v.Name), grafanaVars(q)})
	}
	return out, nil
}

var grafanaVar = regexp.MustCompile(`\$\{?[A-Za-z_][A-Za-z0-9_]*\}?`)

// grafanaVars replaces Grafana's variables by values that parse: intervals by 5m, any
// other variable by a regexp (it stands in label matchers: =~"$instance").
func grafanaVars(expr string) string {
	return grafanaVar.ReplaceAllStringFunc(expr, func(v string) string {
		name := strings.Trim(v, "${}")
		if strings.HasPrefix(name, "__") && strings.Contains(name, "interval") || name == "__range" {
			return "5m"
		}
		return ".+"
	})
}

func ruleExprs(data []byte) ([]located, error) {
	var f struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert  string `yaml:"alert"`
				Record string `yaml:"record"`
				Expr   string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(data, &f); err != nil {
		return nil, err
	}
	var out []located
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			out = append(out, located{fmt.Sprintf("group %s rule %s%s", g.Name, r.Alert, r.Record), r.Expr})
		}
	}
	return out, nil
}

// selectorNames parses expr and returns the metric name of each of its selectors.
func selectorNames(expr string) ([]string, error) {
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	var bad error
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == model.MetricNameLabel && m.Type == labels.MatchEqual {
				name = m.Value
			}
		}
		if name == "" {
			bad = fmt.Errorf("selector %s has no metric name", vs)
		}
		names = append(names, name)
		return nil
	})
	return names, bad
}
