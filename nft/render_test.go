package nft

import (
	"go/ast"
	"go/parser"
	"go/token"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"testing"
)

// renderWant is the exact rendering of each AllStmtKinds value, by type name, per family.
var renderWant = map[string]struct{ ip, ip6 string }{
	"MatchPrefix":             {"ip saddr != 10.0.0.0/8", "ip6 saddr != 10.0.0.0/8"},
	"MatchIifname":            {`iifname != "veth*"`, `iifname != "veth*"`},
	"MatchL4Proto":            {"meta l4proto tcp", "meta l4proto tcp"},
	"MatchCtStateNew":         {"ct state new", "ct state new"},
	"MatchCtStatusDNAT":       {"ct status dnat", "ct status dnat"},
	"MatchMarkUnset":          {"meta mark & 0x00004000 == 0x00000000", "meta mark & 0x00004000 == 0x00000000"},
	"MatchFibDaddrLocal":      {"fib daddr type local", "fib daddr type local"},
	"Lookup":                  {"ip saddr . ip daddr @s", "ip6 saddr . ip6 daddr @s"},
	"VMap":                    {"ip daddr . meta l4proto . th dport vmap @m", "ip6 daddr . meta l4proto . th dport vmap @m"},
	"Verdict":                 {"jump c", "jump c"},
	"Reject":                  {"reject", "reject"},
	"SetMarkBits":             {"meta mark set meta mark | 0x00004000", "meta mark set meta mark | 0x00004000"},
	"Masquerade":              {"masquerade fully-random", "masquerade fully-random"},
	"SNATTo":                  {"snat ip to 192.0.2.10 fully-random", "snat ip6 to 192.0.2.10 fully-random"},
	"MatchCtStateEstablished": {"ct state established", "ct state established"},
	"FlowOffload":             {"flow add @ft", "flow add @ft"},
	"DNATHashMap": {"dnat ip to jhash ip saddr . th sport mod 4093 seed 0x6e667470 offset 256 map @m",
		"dnat ip6 to jhash ip6 saddr . th sport mod 4093 seed 0x6e667470 offset 256 map @m"},
	"DNATNumgenMap": {"dnat ip to numgen random mod 2 offset 100 map @m", "dnat ip6 to numgen random mod 2 offset 100 map @m"},
	"DNATKeyMap": {"dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 3 map @m",
		"dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 3 map @m"},
	"Counter":            {"counter packets 0 bytes 0", "counter packets 0 bytes 0"},
	"MatchFibSaddrLocal": {"fib saddr type local", "fib saddr type local"},
	"MatchNumgen":        {"numgen random mod 3 0", "numgen random mod 3 0"},
	"DNATTo":             {"dnat to 10.0.0.1:8080", "dnat to 10.0.0.1:8080"},
	"UpdateSaddr":        {"update @a { ip saddr }", "update @a { ip6 saddr }"},
}

// TestRenderEveryStmtKind fails when a statement kind has no rendering, renders like
// another kind, or renders differently than documented here.
func TestRenderEveryStmtKind(t *testing.T) {
	for _, fam := range []Family{IPv4, IPv6} {
		seen := map[string]string{} // rendering → kind
		for _, s := range AllStmtKinds() {
			kind := reflect.TypeOf(s).Name()
			t.Run(fam.String()+"/"+kind, func(t *testing.T) {
				got := renderNoPanic(t, fam, s)
				if got == "" {
					t.Fatalf("empty rendering")
				}
				if other, dup := seen[got]; dup {
					t.Errorf("renders as %q, like %s", got, other)
				}
				seen[got] = kind
				want, ok := renderWant[kind]
				if !ok {
					t.Fatalf("no expected rendering for %s in renderWant: add one", kind)
				}
				w := want.ip
				if fam == IPv6 {
					w = want.ip6
				}
				if got != w {
					t.Errorf("RenderStmt(%s, %#v) = %q, want %q", fam, s, got, w)
				}
			})
		}
	}
	// Every expectation belongs to a kind that exists.
	kinds := map[string]bool{}
	for _, s := range AllStmtKinds() {
		kinds[reflect.TypeOf(s).Name()] = true
	}
	for kind := range renderWant {
		if !kinds[kind] {
			t.Errorf("renderWant has %s, which AllStmtKinds does not list", kind)
		}
	}
}

func renderNoPanic(t *testing.T, fam Family, s Stmt) (out string) {
	t.Helper()
	defer func() {
		if r := recover(); r != nil {
			t.Fatalf("RenderStmt panicked: %v", r)
		}
	}()
	return RenderStmt(fam, s)
}

// TestRenderStmtVariants covers the fields that change a statement's text.
func TestRenderStmtVariants(t *testing.T) {
	for _, tc := range []struct {
		fam  Family
		stmt Stmt
		want string
	}{
		{IPv4, MatchPrefix{Field: FieldDaddr, Op: OpEq, Prefix: netip.MustParsePrefix("10.96.0.0/12")}, "ip daddr 10.96.0.0/12"},
		{IPv4, MatchPrefix{Field: FieldSaddr, Op: OpNeq, Prefix: netip.MustParsePrefix("10.244.7.9/16")}, "ip saddr != 10.244.0.0/16"},
		{IPv6, MatchPrefix{Field: FieldSaddr, Op: OpNeq, Prefix: netip.MustParsePrefix("fd00:244::/56")}, "ip6 saddr != fd00:244::/56"},
		{IPv4, MatchL4Proto{Proto: 17}, "meta l4proto udp"},
		{IPv4, MatchL4Proto{Proto: 132}, "meta l4proto sctp"},
		{IPv4, MatchL4Proto{Proto: 47}, "meta l4proto 47"},
		{IPv4, MatchMarkUnset{Bits: 1}, "meta mark & 0x00000001 == 0x00000000"},
		{IPv4, SetMarkBits{Bits: 0x4000, Xor: true}, "meta mark set meta mark ^ 0x00004000"},
		{IPv4, Masquerade{}, "masquerade"},
		{IPv4, DNATNumgenMap{Mod: 3, Map: "endpoints-0"}, "dnat ip to numgen random mod 3 map @endpoints-0"},
		{IPv6, DNATNumgenMap{Mod: 1, Offset: 4096, Map: "endpoints-16"}, "dnat ip6 to numgen random mod 1 offset 4096 map @endpoints-16"},
		{IPv4, DNATKeyMap{Fields: []Field{FieldL4Proto, FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"},
			"dnat ip to meta l4proto . th dport . numgen random mod 1 map @nodeport-endpoints"},
		{IPv6, DNATKeyMap{Fields: []Field{FieldL4Proto, FieldTHDport}, Mod: 7, Map: "nodeport-endpoints"},
			"dnat ip6 to meta l4proto . th dport . numgen random mod 7 map @nodeport-endpoints"},
		{IPv4, Lookup{Fields: []Field{FieldDaddr}, Set: "cluster-ips"}, "ip daddr @cluster-ips"},
		{IPv6, VMap{Fields: []Field{FieldL4Proto, FieldTHDport}, Map: "service-nodeports"}, "meta l4proto . th dport vmap @service-nodeports"},
		{IPv4, Verdict{Kind: Accept}, "accept"},
		{IPv4, Verdict{Kind: Drop}, "drop"},
		{IPv4, Verdict{Kind: Return}, "return"},
		{IPv4, Verdict{Kind: Goto, Chain: "svc-default/echo/tcp/http"}, "goto svc-default/echo/tcp/http"},
	} {
		if got := RenderStmt(tc.fam, tc.stmt); got != tc.want {
			t.Errorf("RenderStmt(%s, %#v) = %q, want %q", tc.fam, tc.stmt, got, tc.want)
		}
	}
}

func TestRenderRule(t *testing.T) {
	r := Rule{Stmts: []Stmt{MatchL4Proto{Proto: 6}, DNATNumgenMap{Mod: 2, Map: "m"}}, Comment: `ns/"q":p`}
	want := `meta l4proto tcp dnat ip to numgen random mod 2 map @m comment "ns/\"q\":p"`
	if got := RenderRule(IPv4, r); got != want {
		t.Errorf("RenderRule = %q, want %q", got, want)
	}
}

func TestRender(t *testing.T) {
	rs := &Ruleset{Family: IPv4, Table: "t", Sets: []*Set{
		{Name: "nets", Key: []Datatype{TypeIPv4Addr}, Dynamic: true, Timeout: 60, Size: 100, Elements: []Element{
			{Key: []Value{Addr(netip.MustParseAddr("10.0.0.1"))}},
			{Key: []Value{Addr(netip.MustParseAddr("192.0.2.1"))}},
		}},
		{Name: "ports", Key: []Datatype{TypeInetProto, TypeInetService}, Data: []Datatype{TypeVerdict}, Comment: "c", Elements: []Element{
			{Key: []Value{Num(17), Num(53)}, Verdict: &Verdict{Kind: Goto, Chain: "x"}, Comment: "dns"},
		}},
		{Name: "empty", Key: []Datatype{TypeIPv4Addr}},
	}, Chains: []*Chain{
		{Name: "x", Rules: []Rule{{Stmts: []Stmt{Reject{}}}}},
		{Name: "in", Hook: &Hook{Type: TypeFilter, Hook: Input, Priority: -110}, Rules: []Rule{{Stmts: []Stmt{MatchCtStateNew{}, Verdict{Kind: Jump, Chain: "x"}}}}},
	}}
	want := `table ip t {
	set nets {
		type ipv4_addr
		size 100
		flags dynamic,timeout
		timeout 60s
		elements = { 10.0.0.1,
			     192.0.2.1 }
	}

	map ports {
		type inet_proto . inet_service : verdict
		comment "c"
		elements = { udp . 53 comment "dns" : goto x }
	}

	set empty {
		type ipv4_addr
	}

	chain x {
		reject
	}

	chain in {
		type filter hook input priority -110; policy accept;
		ct state new jump x
	}
}
`
	if got := Render(rs); got != want {
		t.Errorf("Render:\n%s\nwant:\n%s", got, want)
	}
}

// keyMapsRuleset has both kinds of maps DNATKeyMap reads and the rules reading them.
func keyMapsRuleset(fam Family) *Ruleset {
	addr, ep1, ep2, svc := TypeIPv4Addr, "10.244.1.5", "10.244.2.6", "10.96.0.10"
	if fam == IPv6 {
		addr, ep1, ep2, svc = TypeIPv6Addr, "fd00:1::5", "fd00:2::6", "fd00::10"
	}
	a := func(s string) Value { return Addr(netip.MustParseAddr(s)) }
	return &Ruleset{Family: fam, Table: "t", Sets: []*Set{
		{Name: "endpoints", Key: []Datatype{addr, TypeInetProto, TypeInetService, TypeNumgen}, Data: []Datatype{addr, TypeInetService}, Elements: []Element{
			{Key: []Value{a(svc), Num(6), Num(80), Num(0)}, Data: []Value{a(ep1), Num(8080)}},
			{Key: []Value{a(svc), Num(6), Num(80), Num(1)}, Data: []Value{a(ep2), Num(8080)}},
		}},
		{Name: "nodeport-endpoints", Key: []Datatype{TypeInetProto, TypeInetService, TypeNumgen}, Data: []Datatype{addr, TypeInetService}, Elements: []Element{
			{Key: []Value{Num(17), Num(30053), Num(0)}, Data: []Value{a(ep1), Num(53)}, Comment: "kube-system/dns:dns"},
		}},
	}, Chains: []*Chain{
		{Name: "services", Rules: []Rule{
			{Stmts: []Stmt{DNATKeyMap{Fields: []Field{FieldDaddr, FieldL4Proto, FieldTHDport}, Mod: 2, Map: "endpoints"}}},
			{Stmts: []Stmt{DNATKeyMap{Fields: []Field{FieldL4Proto, FieldTHDport}, Mod: 1, Map: "nodeport-endpoints"}}, Comment: "node ports"},
		}},
	}}
}

// keyMapsText is keyMapsRuleset as nft 1.0.6 lists it back (nft/wire's kernel test holds
// the listing to this).
const keyMapsText = `table ip t {
	map endpoints {
		typeof ip daddr . meta l4proto . th dport . numgen random mod 256 : ip daddr . th dport
		elements = { 10.96.0.10 . tcp . 80 . 0 : 10.244.1.5 . 8080,
			     10.96.0.10 . tcp . 80 . 1 : 10.244.2.6 . 8080 }
	}

	map nodeport-endpoints {
		typeof meta l4proto . th dport . numgen random mod 256 : ip daddr . th dport
		elements = { udp . 30053 . 0 comment "kube-system/dns:dns" : 10.244.1.5 . 53 }
	}

	chain services {
		dnat ip to ip daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints
		dnat ip to meta l4proto . th dport . numgen random mod 1 map @nodeport-endpoints comment "node ports"
	}
}
`

func TestRenderKeyNumgenMaps(t *testing.T) {
	if got := Render(keyMapsRuleset(IPv4)); got != keyMapsText {
		t.Errorf("Render:\n%s\nwant:\n%s", got, keyMapsText)
	}
	want6 := `table ip6 t {
	map endpoints {
		typeof ip6 daddr . meta l4proto . th dport . numgen random mod 256 : ip6 daddr . th dport
		elements = { fd00::10 . tcp . 80 . 0 : fd00:1::5 . 8080,
			     fd00::10 . tcp . 80 . 1 : fd00:2::6 . 8080 }
	}

	map nodeport-endpoints {
		typeof meta l4proto . th dport . numgen random mod 256 : ip6 daddr . th dport
		elements = { udp . 30053 . 0 comment "kube-system/dns:dns" : fd00:1::5 . 53 }
	}

	chain services {
		dnat ip6 to ip6 daddr . meta l4proto . th dport . numgen random mod 2 map @endpoints
		dnat ip6 to meta l4proto . th dport . numgen random mod 1 map @nodeport-endpoints comment "node ports"
	}
}
`
	if got := Render(keyMapsRuleset(IPv6)); got != want6 {
		t.Errorf("Render:\n%s\nwant:\n%s", got, want6)
	}
	if !IsKeyNumgenMap(keyMapsRuleset(IPv4).Sets[1]) || IsKeyNumgenMap(&Set{Key: []Datatype{TypeNumgen}, Data: []Datatype{TypeIPv4Addr, TypeInetService}}) {
		t.Error("IsKeyNumgenMap wrong")
	}
}

// unknownStmt is a statement kind no consumer knows: it can only be declared inside
// package nft, which is the point of the closed set.
type unknownStmt struct{}

func (unknownStmt) isStmt() {}

func TestRenderUnknownStmtPanics(t *testing.T) {
	defer func() {
		r := recover()
		msg, _ := r.(string)
		if r == nil || !strings.Contains(msg, "no rendering for statement nft.unknownStmt") {
			t.Errorf("panic = %v, want a message naming nft.unknownStmt", r)
		}
	}()
	RenderStmt(IPv4, unknownStmt{})
}

// TestAllStmtKindsComplete parses stmt.go and checks that AllStmtKinds lists exactly the
// types declared there with an isStmt method, so that every consumer's table test sees
// every kind.
func TestAllStmtKindsComplete(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "stmt.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var declared []string
	for _, d := range f.Decls {
		fn, ok := d.(*ast.FuncDecl)
		if !ok || fn.Name.Name != "isStmt" || fn.Recv == nil || len(fn.Recv.List) != 1 {
			continue
		}
		typ := fn.Recv.List[0].Type
		if star, ok := typ.(*ast.StarExpr); ok {
			typ = star.X
		}
		if id, ok := typ.(*ast.Ident); ok {
			declared = append(declared, id.Name)
		}
	}
	var listed []string
	for _, s := range AllStmtKinds() {
		listed = append(listed, reflect.TypeOf(s).Name())
	}
	sort.Strings(declared)
	sort.Strings(listed)
	if len(declared) < 10 {
		t.Fatalf("found only %d isStmt types in stmt.go: %v; is the parse right?", len(declared), declared)
	}
	if !reflect.DeepEqual(declared, listed) {
		t.Errorf("stmt.go declares %d statement kinds %v,\nAllStmtKinds lists %d: %v", len(declared), declared, len(listed), listed)
	}
}

// TestRenderFlowtable: a flowtable renders as nft lists it, between the sets and the
// chains, and the original destination as "ct original ip daddr".
func TestRenderFlowtable(t *testing.T) {
	rs := &Ruleset{Family: IPv4, Table: "t",
		Sets:       []*Set{{Name: "cluster-ips", Key: []Datatype{TypeIPv4Addr}}},
		Flowtables: []*Flowtable{{Name: "ft", Devices: []string{"eth0", "veth1"}}},
		Chains: []*Chain{{Name: "c", Hook: &Hook{Type: TypeFilter, Hook: Forward, Priority: 10}, Rules: []Rule{{Stmts: []Stmt{
			MatchCtStateEstablished{}, MatchCtStatusDNAT{}, Lookup{Fields: []Field{FieldCtOrigDaddr}, Set: "cluster-ips"}, FlowOffload{Flowtable: "ft"},
		}}}}},
	}
	got := Render(rs)
	want := `table ip t {
	set cluster-ips {
		type ipv4_addr
	}

	flowtable ft {
		hook ingress priority filter
		devices = { eth0, veth1 }
	}

	chain c {
		type filter hook forward priority 10; policy accept;
		ct state established ct status dnat ct original ip daddr @cluster-ips flow add @ft
	}
}
`
	if got != want {
		t.Errorf("rendered\n%s\nwant\n%s", got, want)
	}
}
