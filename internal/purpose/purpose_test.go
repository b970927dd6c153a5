package purpose

import (
	"testing"

	"github.com/nftproxy/nftproxy/internal/model"
	"github.com/nftproxy/nftproxy/nft"
)

// Every purpose has a name of its own, and a tag reads back as what it was made with.
func TestPurposes(t *testing.T) {
	seen := map[string]Purpose{}
	for p := None; p < numPurposes; p++ {
		name := p.String()
		if purposeNames[p] == "" {
			t.Errorf("purpose %d has no name", p)
		}
		if q, ok := seen[name]; ok {
			t.Errorf("purposes %d and %d are both %q", q, p, name)
		}
		seen[name] = p
	}
	sp := model.ServicePortName{Namespace: "default", Name: "web", Port: "http", Protocol: model.ProtoTCP}
	var tag nft.Tag = &Tag{Port: &sp, Purpose: EndpointDNAT}
	if got, ok := ServicePortOf(tag); !ok || got != sp || Of(tag) != EndpointDNAT {
		t.Errorf("tag %v reads back as %v %v, %v", tag, got, ok, Of(tag))
	}
	if _, ok := ServicePortOf(Table(Hook)); ok || Of(Table(Hook)) != Hook {
		t.Errorf("the table's own tag %v names a service port or another purpose", Table(Hook))
	}
	if Of(nil) != None {
		t.Error("no tag: want None")
	}
}
