package kernel

import (
	"slices"
	"strings"
	"testing"
)

func TestParseRelease(t *testing.T) {
	for _, tc := range []struct {
		in                  string
		major, minor, patch int
		bad                 bool
	}{
		{"6.18.44-fc-v445", 6, 18, 44, false},
		{"6.1.0-26-amd64", 6, 1, 0, false},
		{"5.14.0-427.13.1.el9_4.x86_64", 5, 14, 0, false},
		{"4.18.0-553.el8_10.x86_64", 4, 18, 0, false},
		{"6.12-rc3", 6, 12, 0, false},
		{"5.10", 5, 10, 0, false},
		{"linux", 0, 0, 0, true},
		{"6", 0, 0, 0, true},
		{"6.x", 0, 0, 0, true},
	} {
		r, err := ParseRelease(tc.in)
		if (err != nil) != tc.bad {
			t.Errorf("%q: err %v, want bad=%v", tc.in, err, tc.bad)
			continue
		}
		if !tc.bad && (r.Major != tc.major || r.Minor != tc.minor || r.Patch != tc.patch || r.Raw != tc.in) {
			t.Errorf("%q: got %+v", tc.in, r)
		}
	}
}

func TestCheckRelease(t *testing.T) {
	mustParse := func(s string) Release {
		r, err := ParseRelease(s)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Below the floor: refused, naming what is missing.
	_, err := CheckRelease(mustParse("4.19.0-27-amd64"))
	if err == nil || !strings.Contains(err.Error(), "4.19.0-27-amd64") || !strings.Contains(err.Error(), "set-counters (5.7") {
		t.Errorf("4.19: %v", err)
	}
	if strings.Contains(err.Error(), "numgen") {
		t.Errorf("4.19 has numgen: %v", err)
	}
	_, err = CheckRelease(mustParse("4.9.0"))
	if err == nil || !strings.Contains(err.Error(), "fib (4.10") || strings.Contains(err.Error(), "numgen") {
		t.Errorf("4.9: %v", err)
	}
	// Between the floor and kube-proxy's: runs, with a warning.
	warn, err := CheckRelease(mustParse("5.10.0-32-amd64"))
	if err != nil || !strings.Contains(warn, "5.13") {
		t.Errorf("5.10: warn %q err %v", warn, err)
	}
	warn, err = CheckRelease(mustParse("5.7.0"))
	if err != nil || warn == "" {
		t.Errorf("5.7: warn %q err %v", warn, err)
	}
	// At and above kube-proxy's floor: silent.
	for _, s := range []string{"5.13.0", "6.1.0-26-amd64", "10.0.0"} {
		if warn, err := CheckRelease(mustParse(s)); err != nil || warn != "" {
			t.Errorf("%s: warn %q err %v", s, warn, err)
		}
	}
}

func TestFeaturesFloor(t *testing.T) {
	// The floor constants are the newest feature's kernel.
	var top Feature
	for _, f := range Features {
		if f.Major > top.Major || (f.Major == top.Major && f.Minor > top.Minor) {
			top = f
		}
	}
	if top.Major != FloorMajor || top.Minor != FloorMinor {
		t.Errorf("floor %d.%d, newest feature %s needs %d.%d", FloorMajor, FloorMinor, top.Name, top.Major, top.Minor)
	}
	r, _ := ParseRelease("4.10.0")
	if got := Available(r); !slices.Equal(got, []string{"nf_tables", "meta-l4proto", "rule-comments", "set-ids", "masquerade", "concatenations", "set-timeouts", "set-comments", "numgen", "fib"}) {
		t.Errorf("4.10 features: %q", got)
	}
}

// TestFeatureSources: every feature says what it is for and where its kernel version
// comes from; the list is oldest first (CheckRelease and the startup log read it in
// order); and the floor rests on verified entries only: every feature at the floor's
// release names the release in its source, so the floor is not a guess.
func TestFeatureSources(t *testing.T) {
	for i, f := range Features {
		if f.Name == "" || f.What == "" || f.Source == "" {
			t.Errorf("feature %d %+v lacks a name, a use or a source", i, f)
		}
		if i > 0 {
			p := Features[i-1]
			if f.Major < p.Major || (f.Major == p.Major && f.Minor < p.Minor) {
				t.Errorf("%s (%d.%d) listed after %s (%d.%d): not oldest first", f.Name, f.Major, f.Minor, p.Name, p.Major, p.Minor)
			}
		}
		if f.Major == FloorMajor && f.Minor == FloorMinor && !f.Verified {
			t.Errorf("%s sets the floor %d.%d but its release is unverified: %s", f.Name, FloorMajor, FloorMinor, f.Source)
		}
	}
	names := map[string]bool{}
	for _, f := range Features {
		if names[f.Name] {
			t.Errorf("feature %s listed twice", f.Name)
		}
		names[f.Name] = true
	}
}

// TestFeatureFloorIsNewest: the floor constants are exactly the newest entry, and a
// kernel at the floor has every feature while one just below lacks the newest.
func TestFeatureFloorIsNewest(t *testing.T) {
	newest := Features[len(Features)-1]
	if newest.Major != FloorMajor || newest.Minor != FloorMinor {
		t.Fatalf("floor %d.%d, newest feature %s needs %d.%d", FloorMajor, FloorMinor, newest.Name, newest.Major, newest.Minor)
	}
	at := Release{Major: FloorMajor, Minor: FloorMinor}
	if got := Available(at); len(got) != len(Features) {
		t.Errorf("at the floor %s: features %q, want all %d", at, got, len(Features))
	}
	below := Release{Major: FloorMajor, Minor: FloorMinor - 1}
	if got := Available(below); slices.Contains(got, newest.Name) {
		t.Errorf("below the floor %s: has %s", below, newest.Name)
	}
	if _, err := CheckRelease(below); err == nil || !strings.Contains(err.Error(), newest.Name) {
		t.Errorf("below the floor: %v", err)
	}
}

func TestRunningRelease(t *testing.T) {
	r, err := RunningRelease()
	if err != nil {
		t.Fatal(err)
	}
	if r.Major < 3 || r.Raw == "" {
		t.Errorf("running release %+v", r)
	}
}
