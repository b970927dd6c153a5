// Package wire is nf_tables on the wire: the one place in nftproxy that knows the
// netlink message and attribute layouts of nf_tables objects. It encodes typed rulesets
// (package nft) into messages exactly as nft 1.0.6 would (Batch, sent to the kernel as
// one transaction), decodes the kernel's dumps and events back (TableState, Decode),
// opens the netlink sockets (Dial) and asks the kernel for its ruleset generation
// (GenID). It keeps no state between calls: the applier (nft/kernel), the monitor
// (nft/monitor) and the verifier (nft/readback) build on it.
//
// One netlink library, github.com/mdlayher/netlink, opens the sockets and parses
// attributes; messages, attributes and rule expressions are written here, straight into
// the batch's pages.
//
// Files: batch.go (messages of one transaction, sent as one sendmsg), encode.go
// (statements, values and set userdata), conn.go (sockets and listings), read.go
// (ReadTable, Dump, GenID), state.go (TableState: dumps and encodings parsed alike),
// decode.go (TableState back to nft.Ruleset), canon.go (canonical and readable forms),
// counters.go (counter dumps), events.go (change events).
package wire
