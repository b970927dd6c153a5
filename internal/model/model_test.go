package model_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
)

// e is an endpoint 10.0.0.<n>:80 with conditions spelled as in dumpEndpoint: "RS-" is
// ready, serving, not terminating.
func e(n byte, flags string) model.Endpoint {
	return model.Endpoint{
		Addr: netip.AddrFrom4([4]byte{10, 0, 0, n}), Port: 80,
		Ready: flags[0] == 'R', Serving: flags[1] == 'S', Terminating: flags[2] == 'T',
	}
}

func TestUsableEndpoints(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []model.Endpoint
		want []model.Endpoint
	}{
		{name: "nil", in: nil, want: nil},
		{name: "empty", in: []model.Endpoint{}, want: nil},
		{name: "all ready", in: []model.Endpoint{e(1, "RS-"), e(2, "RS-")}, want: []model.Endpoint{e(1, "RS-"), e(2, "RS-")}},
		{
			name: "ready ones only, terminating ones are not mixed in",
			in:   []model.Endpoint{e(1, "-ST"), e(2, "RS-"), e(3, "-ST")},
			want: []model.Endpoint{e(2, "RS-")},
		},
		{
			name: "ready and terminating (ready wins, kept in order)",
			in:   []model.Endpoint{e(1, "RST"), e(2, "-ST"), e(3, "RS-")},
			want: []model.Endpoint{e(1, "RST"), e(3, "RS-")},
		},
		{
			name: "none ready: serving and terminating ones",
			in:   []model.Endpoint{e(1, "-ST"), e(2, "-S-"), e(3, "--T"), e(4, "-ST")},
			want: []model.Endpoint{e(1, "-ST"), e(4, "-ST")},
		},
		{name: "serving false is never used, even terminating", in: []model.Endpoint{e(1, "--T")}, want: nil},
		{name: "serving but neither ready nor terminating is not used", in: []model.Endpoint{e(1, "-S-")}, want: nil},
		{name: "not ready, not serving, not terminating", in: []model.Endpoint{e(1, "---")}, want: nil},
		{name: "ready even if serving is false (ready wins)", in: []model.Endpoint{e(1, "R--")}, want: []model.Endpoint{e(1, "R--")}},
		{
			name: "one ready among many unusable",
			in:   []model.Endpoint{e(1, "---"), e(2, "--T"), e(3, "-S-"), e(4, "RS-"), e(5, "-ST")},
			want: []model.Endpoint{e(4, "RS-")},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := model.UsableEndpoints(tc.in, nil)
			if dumpEndpoints(got) != dumpEndpoints(tc.want) {
				t.Errorf("UsableEndpoints = [%s], want [%s]", dumpEndpoints(got), dumpEndpoints(tc.want))
			}
		})
	}
}

func dumpEndpoints(eps []model.Endpoint) string {
	s := make([]string, len(eps))
	for i, e := range eps {
		s[i] = dumpEndpoint(e)
	}
	return strings.Join(s, ",")
}

func TestServicePortName(t *testing.T) {
	named := model.ServicePortName{Namespace: "ns", Name: "svc", Port: "http", Protocol: model.ProtoTCP}
	unnamed := model.ServicePortName{Namespace: "ns", Name: "svc", Protocol: model.ProtoTCP}
	if got := named.String(); got != "ns/svc:http" {
		t.Errorf("String() = %q", got)
	}
	if got := unnamed.String(); got != "ns/svc" {
		t.Errorf("String() = %q", got)
	}
	// Less is a strict order over namespace, name, port, protocol.
	ordered := []model.ServicePortName{
		{Namespace: "a", Name: "z", Port: "z", Protocol: model.ProtoSCTP},
		{Namespace: "b", Name: "a", Port: "z", Protocol: model.ProtoSCTP},
		{Namespace: "b", Name: "b", Port: "", Protocol: model.ProtoSCTP},
		{Namespace: "b", Name: "b", Port: "a", Protocol: model.ProtoTCP},
		{Namespace: "b", Name: "b", Port: "a", Protocol: model.ProtoUDP},
	}
	for i := range ordered {
		for j := range ordered {
			if got, want := ordered[i].Less(ordered[j]), i < j; got != want {
				t.Errorf("%v.Less(%v) = %v, want %v", ordered[i], ordered[j], got, want)
			}
		}
	}
	for p, want := range map[uint8]string{model.ProtoTCP: "TCP", model.ProtoUDP: "UDP", model.ProtoSCTP: "SCTP", 1: "proto-1"} {
		if got := model.ProtoString(p); got != want {
			t.Errorf("ProtoString(%d) = %q, want %q", p, got, want)
		}
	}
}

func TestAddrsOf(t *testing.T) {
	in := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("fd00::1"), netip.MustParseAddr("10.0.0.2")}
	if got := addrs(model.AddrsOf(in, false)); got != "10.0.0.1,10.0.0.2" {
		t.Errorf("AddrsOf(v4) = %s", got)
	}
	if got := addrs(model.AddrsOf(in, true)); got != "fd00::1" {
		t.Errorf("AddrsOf(v6) = %s", got)
	}
	if got := model.AddrsOf(nil, true); got != nil {
		t.Errorf("AddrsOf(nil) = %v", got)
	}
}

// keep restricts the choice before the ready/terminating fallback: a kept terminating
// endpoint is used when no kept endpoint is ready, whatever the others are.
func TestUsableEndpointsKeep(t *testing.T) {
	in := []model.Endpoint{e(1, "RS-"), e(2, "-ST"), e(3, "RS-"), e(4, "-ST")}
	even := func(ep model.Endpoint) bool { return ep.Addr.As4()[3]%2 == 0 }
	if got := dumpEndpoints(model.UsableEndpoints(in, even)); got != dumpEndpoints([]model.Endpoint{e(2, "-ST"), e(4, "-ST")}) {
		t.Errorf("even: [%s]", got)
	}
	odd := func(ep model.Endpoint) bool { return !even(ep) }
	if got := dumpEndpoints(model.UsableEndpoints(in, odd)); got != dumpEndpoints([]model.Endpoint{e(1, "RS-"), e(3, "RS-")}) {
		t.Errorf("odd: [%s]", got)
	}
	if got := model.UsableEndpoints(in, func(model.Endpoint) bool { return false }); got != nil {
		t.Errorf("none kept: [%s]", dumpEndpoints(got))
	}
}

// ServingEndpoints keeps the flows of every ready or serving endpoint, terminating or
// not, even while others are ready.
func TestServingEndpoints(t *testing.T) {
	in := []model.Endpoint{e(1, "RS-"), e(2, "-ST"), e(3, "--T"), e(4, "-S-"), e(5, "R--"), e(6, "---")}
	want := []model.Endpoint{e(1, "RS-"), e(2, "-ST"), e(4, "-S-"), e(5, "R--")}
	if got := model.ServingEndpoints(in); dumpEndpoints(got) != dumpEndpoints(want) {
		t.Errorf("ServingEndpoints = [%s], want [%s]", dumpEndpoints(got), dumpEndpoints(want))
	}
}
