package kernel

import (
	"errors"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// probeTable is the throwaway table ProbeFlowtables creates and deletes in one
// transaction.
const probeTable = "nftproxy-probe"

// ProbeFlowtables reports whether the kernel creates flowtables (nft.Flowtable) in
// tables of family fam: nil if it does, else its refusal (a *RejectedError; ENOENT from
// a kernel built without CONFIG_NF_FLOW_TABLE or without the family's flowtable type).
// Kernel releases do not tell: flowtables are a build option. The probe is one
// transaction on the Applier's write socket that creates a table with a flowtable on
// "lo" and deletes the table again, so it commits nothing.
func (a *Applier) ProbeFlowtables(fam nft.Family) error {
	conn, err := a.writer()
	if err != nil {
		return err
	}
	b := wire.NewBatch(fam, probeTable)
	b.AddTable()
	b.AddFlowtable(&nft.Flowtable{Name: "probe", Devices: []string{"lo"}})
	b.DelTable()
	err = b.Send(conn)
	var rejected *RejectedError
	if err != nil && !errors.As(err, &rejected) {
		_ = a.retire() // its receive queue may hold stale answers
	}
	return err
}
