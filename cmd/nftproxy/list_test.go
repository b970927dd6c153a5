package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/inspect"
	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// encodedTables reads back what a ruleset encodes to, without a kernel; a family in
// broken fails to read.
type encodedTables struct {
	rulesets map[nft.Family]*nft.Ruleset
	broken   nft.Family
}

func (e encodedTables) ReadBack(fam nft.Family, table string) (*wire.TableState, error) {
	if fam == e.broken {
		return nil, errors.New("no netlink today")
	}
	rs := e.rulesets[fam]
	if rs == nil || rs.Table != table {
		return &wire.TableState{Family: fam, Name: table}, nil
	}
	return wire.EncodeState(rs)
}

// TestListCommand: nftproxy list prints internal/inspect's listing of the tables as a
// table or as JSON, and says when there is no table, or a table cannot be read, by its
// exit code and on stderr.
func TestListCommand(t *testing.T) {
	snap := &model.Snapshot{
		Node:     model.Node{Name: "node-1", IPs: []netip.Addr{netip.MustParseAddr("192.0.2.10")}},
		Services: model.Ports([]model.ServicePort{testrules.Service("web", "10.96.0.1", 30080, 0, 2), testrules.Service("empty", "10.96.0.2", 0, 0, 0)}),
	}
	rs, _ := compile.Compile(snap, testrules.Config(), compile.NewSlots())
	tables := encodedTables{rulesets: map[nft.Family]*nft.Ruleset{nft.IPv4: rs}}
	want, err := inspect.List(tables, []nft.Family{nft.IPv4}, nil)
	if err != nil || len(want.Ports) != 2 {
		t.Fatalf("premise: %+v, %v", want, err)
	}
	var wantText bytes.Buffer
	if err := inspect.WriteTable(&wantText, want.Ports); err != nil {
		t.Fatal(err)
	}

	run := func(args []string, r inspect.TableReader) (int, string, string) {
		var out, errs bytes.Buffer
		code := listCommand(args, r, &out, &errs)
		return code, out.String(), errs.String()
	}
	if code, out, errs := run(nil, tables); code != 0 || out != wantText.String() || errs != "" {
		t.Errorf("text: exit %d, stderr %q, output\n%s\nwant\n%s", code, errs, out, wantText.String())
	}
	for _, want := range []string{"default/empty:http", "(none: rejected)", "*:30080", "10.244.0.2:8080 50.0%"} {
		if !strings.Contains(wantText.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, wantText.String())
		}
	}
	code, out, errs := run([]string{"-o", "json"}, tables)
	var ports []inspect.Port
	if err := json.Unmarshal([]byte(out), &ports); code != 0 || err != nil || errs != "" {
		t.Fatalf("json: exit %d, %v, stderr %q\n%s", code, err, errs, out)
	}
	if len(ports) != 2 || ports[1].Service != "default/web:http" || len(ports[1].Frontends) != 2 || ports[1].Frontends[1].Type != inspect.FrontendNodePort ||
		len(ports[1].Frontends[0].Endpoints) != 2 || ports[1].Frontends[0].Endpoints[0] != (inspect.Endpoint{Address: "10.244.0.1:8080", Probability: 0.5}) {
		t.Errorf("json: %+v", ports)
	}

	empty := encodedTables{}
	if code, _, errs := run(nil, empty); code != 1 || !strings.Contains(errs, "no nftproxy table") {
		t.Errorf("no table: exit %d, stderr %q", code, errs)
	}
	if code, out, _ := run([]string{"-o", "json"}, empty); code != 1 || out != "" {
		t.Errorf("no table, json: exit %d, output %q", code, out)
	}
	if code, _, errs := run(nil, encodedTables{rulesets: tables.rulesets, broken: nft.IPv6}); code != 2 || !strings.Contains(errs, "nftproxy list: reading ip6 nftproxy from the kernel: no netlink today") {
		t.Errorf("unreadable table: exit %d, stderr %q", code, errs)
	}
	for _, args := range [][]string{{"-o", "yaml"}, {"extra"}, {"--bogus"}} {
		if code, _, _ := run(args, tables); code != 2 {
			t.Errorf("%q: exit %d, want 2", args, code)
		}
	}
	if code, _, errs := run([]string{"--help"}, tables); code != 0 || !strings.Contains(errs, "usage: nftproxy list") {
		t.Errorf("--help: exit %d, stderr %q", code, errs)
	}
}
