package inspect

import (
	"bytes"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/purpose"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/trace"
)

func step(chain string, r nft.Rule, matched ...trace.Match) trace.Step {
	return trace.Step{Chain: chain, Rule: r, Text: nft.RenderRule(nft.IPv4, r), Matched: matched}
}

func rule(comment string, stmts ...nft.Stmt) nft.Rule {
	return nft.Rule{Stmts: stmts, Comment: comment}
}

// tagged gives a rule the compiler's tag.
func tagged(r nft.Rule, sp model.ServicePortName, p purpose.Purpose) nft.Rule {
	r.Tag = &purpose.Tag{Port: &sp, Purpose: p}
	return r
}

func jump(c string) nft.Verdict { return nft.Verdict{Kind: nft.Jump, Chain: c} }

// TestFormatResult formats a fixed Result: a cluster IP reached from outside the cluster
// CIDR, two endpoints, masqueraded.
func TestFormatResult(t *testing.T) {
	svcIPs := &nft.Set{Name: "service-ips"}
	echo := model.ServicePortName{Namespace: "default", Name: "echo", Port: "http", Protocol: model.ProtoTCP}
	eps := &nft.Set{Name: "endpoints-0"}
	outcome := func(slot int, ep string) trace.Outcome {
		return trace.Outcome{
			Probability: 0.5, Verdict: trace.Accept, DNAT: netip.MustParseAddrPort(ep), Masquerade: true,
			Path: []trace.Step{
				step("nat-prerouting", rule("", jump("services"))),
				step("services", rule("", nft.VMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Map: "service-ips"}),
					trace.Match{Set: svcIPs, Element: nft.Element{Comment: "default/echo:http", Tag: &purpose.Tag{Port: &echo, Purpose: purpose.Dispatch}}, Text: `10.96.0.10 . tcp . 80 comment "default/echo:http" : goto svc-default/echo/tcp/http`}),
				step("svc-default/echo/tcp/http", tagged(rule("",
					nft.MatchPrefix{Field: nft.FieldDaddr, Prefix: netip.MustParsePrefix("10.96.0.10/32")},
					nft.MatchPrefix{Field: nft.FieldSaddr, Op: nft.OpNeq, Prefix: netip.MustParsePrefix("10.244.0.0/16")},
					jump("mark-for-masquerade")), echo, purpose.MarkOffCluster)),
				step("mark-for-masquerade", rule("", nft.SetMarkBits{Bits: 0x4000})),
				step("svc-default/echo/tcp/http", tagged(rule("default/echo:http", nft.MatchL4Proto{Proto: 6}, nft.DNATNumgenMap{Mod: 2, Map: "endpoints-0"}), echo, purpose.EndpointDNAT),
					trace.Match{Set: eps, Text: []string{"0 : 10.244.1.2 . 8080", "1 : 10.244.1.3 . 8080"}[slot]}),
				step("nat-postrouting", rule("", jump("masquerading"))),
				step("masquerading", rule("", nft.SetMarkBits{Bits: 0x4000, Xor: true})),
				step("masquerading", rule("", nft.Masquerade{FullyRandom: true})),
			},
		}
	}
	res := &trace.Result{
		Packet:   trace.Packet{Family: nft.IPv4, Saddr: netip.MustParseAddr("172.16.0.9"), Daddr: netip.MustParseAddr("10.96.0.10"), L4Proto: 6, Dport: 80, Hook: nft.Prerouting},
		Outcomes: []trace.Outcome{outcome(0, "10.244.1.2:8080"), outcome(1, "10.244.1.3:8080")},
	}
	var b bytes.Buffer
	formatResult(&b, res, scene{})
	want := `tcp 172.16.0.9 → 10.96.0.10:80, arriving from the network
service default/echo:http
     50%  → 10.244.1.2:8080, masqueraded: the source is outside the cluster CIDR 10.244.0.0/16
     50%  → 10.244.1.3:8080, masqueraded: the source is outside the cluster CIDR 10.244.0.0/16
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}

	b.Reset()
	res.Outcomes = res.Outcomes[:1]
	formatResult(&b, res, scene{source: "a pod", rules: true, problems: []string{"Service default/echo: something, ignored"}})
	want = `tcp 172.16.0.9 (a pod) → 10.96.0.10:80, arriving from the network
service default/echo:http
  → 10.244.1.2:8080, masqueraded: the source is outside the cluster CIDR 10.244.0.0/16
        nat-prerouting: jump services
        services: ip daddr . meta l4proto . th dport vmap @service-ips
          @service-ips: 10.96.0.10 . tcp . 80 comment "default/echo:http" : goto svc-default/echo/tcp/http
        svc-default/echo/tcp/http: ip daddr 10.96.0.10 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
        mark-for-masquerade: meta mark set meta mark | 0x00004000
        svc-default/echo/tcp/http: meta l4proto tcp dnat ip to numgen random mod 2 map @endpoints-0 comment "default/echo:http"
          @endpoints-0: 0 : 10.244.1.2 . 8080
        nat-postrouting: jump masquerading
        masquerading: meta mark set meta mark ^ 0x00004000
        masquerading: masquerade fully-random
note: ignored: Service default/echo: something, ignored
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestFormatReject(t *testing.T) {
	noEps := &nft.Set{Name: "no-endpoint-services"}
	res := &trace.Result{
		Packet: trace.Packet{Family: nft.IPv4, Saddr: netip.MustParseAddr("192.0.2.10"), Daddr: netip.MustParseAddr("10.96.1.2"), L4Proto: 17, Dport: 53, Hook: nft.Output},
		Outcomes: []trace.Outcome{{Probability: 1, Verdict: trace.Reject, Path: []trace.Step{
			step("filter-output", rule("", nft.MatchCtStateNew{}, jump("service-endpoints-check"))),
			step("service-endpoints-check", rule("", nft.VMap{Fields: []nft.Field{nft.FieldDaddr, nft.FieldL4Proto, nft.FieldTHDport}, Map: noEps.Name}),
				trace.Match{Set: noEps, Element: nft.Element{Comment: "kube-system/dns", Verdict: &nft.Verdict{Kind: nft.Goto, Chain: "reject-chain"},
					Tag: &purpose.Tag{Port: &model.ServicePortName{Namespace: "kube-system", Name: "dns", Protocol: model.ProtoUDP}, Purpose: purpose.RejectNoEndpoints}}}),
			step("reject-chain", rule("", nft.Reject{})),
		}}},
	}
	var b bytes.Buffer
	formatResult(&b, res, scene{source: "the node"})
	want := `udp 192.0.2.10 (the node) → 10.96.1.2:53, sent by the node itself
service kube-system/dns
  rejected: no endpoints: the service has no ready endpoints
`
	if b.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", b.String(), want)
	}
}

func TestParseDest(t *testing.T) {
	for in, want := range map[string]string{
		"10.96.0.10:80":         "10.96.0.10:80/6",
		"10.96.0.10:53/udp":     "10.96.0.10:53/17",
		"10.96.0.10:3868/SCTP":  "10.96.0.10:3868/132",
		"[fd00:96::10]:443/tcp": "[fd00:96::10]:443/6",
		"10.96.0.10":            "error",
		"10.96.0.10:80/icmp":    "error",
		"fd00::1:80":            "error",
	} {
		ap, proto, err := ParseDest(in)
		got := "error"
		if err == nil {
			got = fmt.Sprintf("%s/%d", ap, proto)
		}
		if got != want {
			t.Errorf("ParseDest(%q) = %s, want %s", in, got, want)
		}
	}
}

// TestExplainCompiled explains packets through rulesets compiled here, without the API:
// the source defaults to a pod of the cluster CIDR, and an externalIP the compiler left
// out under AllowServiceExternalIPs=false is explained as not programmed, for that
// reason.
func TestExplainCompiled(t *testing.T) {
	snap := listSnapshot()
	cfg := listConfig()
	explainOf := func(cfg compile.Config, q Question) string {
		t.Helper()
		rs, problems := compile.Compile(snap, cfg, compile.NewSlots())
		var b bytes.Buffer
		err := Explain(&b, q, Compiled{Snapshot: snap, Rulesets: []*nft.Ruleset{rs}, Problems: problems, DetectLocal: cfg.DetectLocal, NoExternalIPs: cfg.NoExternalIPs})
		if err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := explainOf(cfg, Question{Dest: netip.MustParseAddrPort("10.96.0.1:80"), Proto: model.ProtoTCP})
	for _, want := range []string{"tcp 10.244.0.1 (a pod) → 10.96.0.1:80, arriving from the network", "service default/plain:http",
		"50%  → 10.244.0.1:8080, masqueraded: hairpin", "50%  → 10.244.0.2:8080, client address kept"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	ext := Question{Dest: netip.MustParseAddrPort("203.0.113.7:80"), Proto: model.ProtoTCP, From: "203.0.113.5"}
	if out := explainOf(cfg, ext); !strings.Contains(out, "→ 10.244.0.22:8080") {
		t.Errorf("externalIP allowed: not translated to the local endpoint:\n%s", out)
	}
	cfg.NoExternalIPs = true
	out = explainOf(cfg, ext)
	if want := "not translated: service default/lb's port 80/TCP at this address is not programmed: the feature gate AllowServiceExternalIPs is false"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
	var b bytes.Buffer
	if err := Explain(&b, Question{Dest: netip.MustParseAddrPort("[fd00::1]:80"), Proto: model.ProtoTCP, From: "fd00::2"}, Compiled{Snapshot: snap}); err == nil || !strings.Contains(err.Error(), "no ip6 ruleset") {
		t.Errorf("no IPv6 ruleset: %v", err)
	}
}
