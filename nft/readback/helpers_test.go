package readback_test

import (
	"github.com/nftproxy/nftproxy/internal/compile"
	"github.com/nftproxy/nftproxy/internal/testnetns"
	"github.com/nftproxy/nftproxy/internal/testrules"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/kernel"
	"github.com/nftproxy/nftproxy/nft/readback"
)

func cfg() compile.Config { return testrules.Config() }

// svc returns a service port with n endpoints, numbered from first.
var svc = testrules.Service

// applierReader writes a namespace's tables and reads them back.
type applierReader struct {
	*kernel.Applier
	readback.Reader
}

func newApplier(ns *testnetns.NS) applierReader {
	return applierReader{kernel.New(kernel.WithNetNS(ns.FD)), readback.Reader{NetNS: ns.FD}}
}

// slotsByContent compares the compiler's endpoint slot maps (keyed by a numgen integer)
// by content, as nftproxy verify does.
var slotsByContent = readback.MapsByContent(func(s *nft.Set) bool {
	return len(s.Key) == 1 && s.Key[0] == nft.TypeNumgen
})
