package wire

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

// roundTrips are statements of every kind, with the operands that change their
// encoding, and the families they are written in (nil: both).
var roundTrips = []struct {
	s    nft.Stmt
	fams []nft.Family
}{
	{s: nft.MatchPrefix{Field: nft.FieldSaddr, Prefix: netip.MustParsePrefix("10.0.0.0/8")}, fams: v4},
	{s: nft.MatchPrefix{Field: nft.FieldDaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.96.0.1/32")}, fams: v4},
	{s: nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.244.0.0/17")}, fams: v4},
	{s: nft.MatchPrefix{Field: nft.FieldDaddr, Prefix: netip.MustParsePrefix("fd00::/13")}, fams: v6},
	{s: nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("fd00::1/128")}, fams: v6},
	{s: nft.MatchIifname{Name: "cni0"}},
	{s: nft.MatchIifname{Op: nft.OpNeq, Name: "veth", Prefix: true}},
	{s: nft.MatchIifname{Name: "a-fifteen-bytes"}},
	{s: nft.MatchL4Proto{Proto: 6}},
	{s: nft.MatchL4Proto{Proto: 132}},
	{s: nft.MatchCtStateNew{}},
	{s: nft.MatchCtStatusDNAT{}},
	{s: nft.MatchMarkUnset{Bits: 0x4000}},
	{s: nft.MatchMarkUnset{Bits: 1}},
	{s: nft.MatchFibDaddrLocal{}},
	{s: nft.MatchFibSaddrLocal{}},
	{s: nft.MatchNumgen{Mod: 3}},
	{s: nft.Lookup{Fields: []nft.Field{nft.FieldSaddr}, Set: "s"}},
	{s: nft.Lookup{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr}, Set: "pairs"}},
	{s: nft.Lookup{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Set: "service-ips"}},
	{s: nft.VMap{Fields: []nft.Field{nft.FieldDaddr}, Map: "m"}},
	{s: nft.VMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Map: "service-ips"}},
	{s: nft.VMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Map: "nodeports"}},
	{s: nft.UpdateSaddr{Set: "affinity"}},
	{s: nft.Verdict{Kind: nft.Accept}},
	{s: nft.Verdict{Kind: nft.Drop}},
	{s: nft.Verdict{Kind: nft.Return}},
	{s: nft.Verdict{Kind: nft.Jump, Chain: "c"}},
	{s: nft.Verdict{Kind: nft.Goto, Chain: "endpoint-of-a-long-name"}},
	{s: nft.Reject{}},
	{s: nft.Counter{}},
	{s: nft.SetMarkBits{Bits: 0x4000}},
	{s: nft.SetMarkBits{Bits: 0x4000, Xor: true}},
	{s: nft.SetMarkBits{}}, // with no bits the Xor form encodes the same: decoded as this one
	{s: nft.Masquerade{}},
	{s: nft.Masquerade{FullyRandom: true}},
	{s: nft.DNATNumgenMap{Mod: 2, Map: "m"}},
	{s: nft.DNATNumgenMap{Mod: 7, Offset: 100, Map: "endpoints-p"}},
	{s: nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 3, Map: "endpoints"}},
	{s: nft.DNATKeyMap{Fields: []nft.Field{nft.FieldL4Proto, nft.FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}},
	{s: nft.DNATTo{Addr: netip.MustParseAddr("10.244.1.2"), Port: 8080}, fams: v4},
	{s: nft.DNATTo{Addr: netip.MustParseAddr("fd00::1"), Port: 65535}, fams: v6},
	{s: nft.DNATHashMap{Mod: 4093, Seed: 0x6e667470, Map: "endpoints-0"}},
	{s: nft.DNATHashMap{Mod: 16381, Seed: 1, Offset: 8192, Map: "endpoints-32"}},
	{s: nft.SNATTo{Addr: netip.MustParseAddr("192.0.2.10")}, fams: v4},
	{s: nft.SNATTo{Addr: netip.MustParseAddr("2001:db8::10")}, fams: v6},
	{s: nft.MatchCtStateEstablished{}},
	{s: nft.FlowOffload{Flowtable: "ft"}},
	{s: nft.Lookup{Fields: []nft.Field{nft.FieldCtOrigDaddr}, Set: "cluster-ips"}},
}

var (
	v4 = []nft.Family{nft.IPv4}
	v6 = []nft.Family{nft.IPv6}
)

// TestStatementRoundTrip encodes each statement alone and decodes it back: the same
// statement, spanning exactly its expressions, in each family it is written in.
func TestStatementRoundTrip(t *testing.T) {
	for _, tc := range roundTrips {
		fams := tc.fams
		if fams == nil {
			fams = []nft.Family{nft.IPv4, nft.IPv6}
		}
		for _, fam := range fams {
			enc, err := encodeStmt(fam, tc.s)
			if err != nil {
				t.Errorf("%s %#v: %v", fam, tc.s, err)
				continue
			}
			got, n := decodeStmt(fam, enc)
			if n != len(enc) || !reflect.DeepEqual(got, tc.s) {
				t.Errorf("%s %#v: decoded %#v from %d of its %d expressions", fam, tc.s, got, n, len(enc))
			}
		}
	}
}

// TestRuleRoundTrip: a rule of several statements decodes statement by statement,
// each where the one before ends.
func TestRuleRoundTrip(t *testing.T) {
	rule := nft.Rule{Comment: "default/web:http", Stmts: []nft.Stmt{
		nft.MatchL4Proto{Proto: 6},
		nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.244.0.0/16")},
		nft.MatchMarkUnset{Bits: 0x4000},
		nft.SetMarkBits{Bits: 0x4000},
		nft.UpdateSaddr{Set: "affinity"},
		nft.Counter{},
		nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Mod: 2, Map: "endpoints"},
	}}
	rs := &nft.Ruleset{Family: nft.IPv4, Table: "t", Chains: []*nft.Chain{{Name: "x", Rules: []nft.Rule{rule}}}}
	st, err := EncodeState(rs)
	if err != nil {
		t.Fatal(err)
	}
	got, ok := DecodeRule(nft.IPv4, st.Chains["x"].Rules[0])
	if !ok || !reflect.DeepEqual(got, rule) {
		t.Fatalf("decoded %#v (ok %v), want %#v", got, ok, rule)
	}
}

// TestEveryStatementKindRoundTrips: every statement kind of package nft (each type
// with an isStmt method in nft/stmt.go) has exactly one codec, a round trip above and
// a sample in nft.AllStmtKinds. A new kind without them fails here.
func TestEveryStatementKindRoundTrips(t *testing.T) {
	kinds := stmtKindsOf(t, "../stmt.go")
	if len(kinds) < 20 {
		t.Fatalf("found %d statement kinds in nft/stmt.go: %v", len(kinds), kinds)
	}
	names := func(types []reflect.Type) []string {
		var out []string
		for _, ty := range types {
			out = append(out, ty.Name())
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	var codecs, tested, samples []reflect.Type
	for _, c := range stmtCodecs {
		codecs = append(codecs, c.kind())
	}
	for _, tc := range roundTrips {
		tested = append(tested, reflect.TypeOf(tc.s))
	}
	for _, s := range nft.AllStmtKinds() {
		samples = append(samples, reflect.TypeOf(s))
	}
	if len(codecs) != len(names(codecs)) {
		t.Errorf("a kind with two codecs: %v", codecs)
	}
	for what, got := range map[string][]string{"codecs": names(codecs), "round trips": names(tested), "nft.AllStmtKinds": names(samples)} {
		if !slices.Equal(got, kinds) {
			t.Errorf("%s cover %v; the statement kinds are %v", what, got, kinds)
		}
	}
}

// stmtKindsOf lists the types with an isStmt method in a Go file, sorted.
func stmtKindsOf(t *testing.T, file string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "isStmt" || fd.Recv == nil || len(fd.Recv.List) != 1 {
			continue
		}
		if id, ok := fd.Recv.List[0].Type.(*ast.Ident); ok {
			out = append(out, id.Name)
		}
	}
	slices.Sort(out)
	return out
}

// TestStatementEncodeErrors: what the encoders refuse, rather than send to the kernel.
func TestStatementEncodeErrors(t *testing.T) {
	for _, tc := range []struct {
		s    nft.Stmt
		want string
	}{
		{nft.MatchIifname{Name: ""}, "not 1 to 15 bytes"},
		{nft.MatchIifname{Name: "sixteen-bytes-xx"}, "not 1 to 15 bytes"},
		{nft.Verdict{}, "unknown verdict kind"},
		{nft.DNATKeyMap{Map: "m", Mod: 2}, "no key fields"},
		{nft.DNATKeyMap{Fields: []nft.Field{nft.FieldDaddr}, Map: "m"}, "modulus 0"},
		{nil, "no encoding for statement"},
	} {
		b := NewBatch(nft.IPv4, "t")
		err := b.stmt(nft.IPv4, tc.s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%#v: %v, want an error with %q", tc.s, err, tc.want)
		}
	}
	// four 16-byte fields do not fit the registers with the numgen index
	six := NewBatch(nft.IPv6, "t")
	if err := six.stmt(nft.IPv6, nft.DNATKeyMap{Fields: []nft.Field{nft.FieldSaddr, nft.FieldDaddr, nft.FieldSaddr, nft.FieldDaddr}, Mod: 2, Map: "m"}); err == nil ||
		!strings.Contains(err.Error(), "does not fit the registers") {
		t.Errorf("a 68-byte key: %v", err)
	}
}

// TestGuessesOnlyTheirOwn: each codec's guesses are of its kind, and none is made from
// expressions no statement starts with.
func TestGuessesOnlyTheirOwn(t *testing.T) {
	for _, tc := range roundTrips {
		enc, err := encodeStmt(nft.IPv4, tc.s)
		if err != nil {
			continue
		}
		for _, c := range stmtCodecs {
			for _, g := range c.guess(nft.IPv4, enc) {
				if reflect.TypeOf(g) != c.kind() {
					t.Errorf("the %v codec guessed a %T", c.kind(), g)
				}
			}
		}
	}
	for _, es := range [][]ExprState{
		{{Name: "quota"}},
		{{Name: "cmp"}, {Name: "counter"}},
		{{Name: "payload"}}, // loads nothing nftproxy reads, nothing after it
	} {
		if got := candidates(nft.IPv4, es); len(got) != 0 {
			t.Errorf("%v: guessed %v", es, got)
		}
		if s, n := decodeStmt(nft.IPv4, es); n != 0 {
			t.Errorf("%v: decoded %#v", es, s)
		}
	}
}
