package wire

import (
	"fmt"
	"reflect"

	"github.com/nftproxy/nftproxy/nft"
)

// Every statement kind of package nft has one codec: how it is encoded (its
// expressions, written into a batch) and what it is decoded from (the statements of its
// kind a rule's expressions may start with), side by side in the file of its family:
// stmt_match.go (matches), stmt_set.go (set lookups and updates), stmt_action.go
// (verdicts, reject, counter, mark setting), stmt_nat.go (NAT) and stmt_flow.go (the
// fast path: ct state established, flow add). Decoding is guess and
// check (decodeStmt): a guess is kept only when its encoding is the expressions found.
//
// A new statement kind: its type in nft/stmt.go, its rendering in nft/render.go, its
// codec in the file of its family here, listed in stmtCodecs, and a sample in
// stmt_test.go's round trip (TestEveryStatementKindRoundTrips fails without one).

// stmtCodec is one statement kind on the wire.
type stmtCodec interface {
	kind() reflect.Type
	encode(b *Batch, fam nft.Family, s nft.Stmt) error
	// guess returns the statements of this kind the expressions may start with, their
	// operands read from the attributes (none when es cannot start with one).
	guess(fam nft.Family, es []ExprState) []nft.Stmt
}

// codec is the stmtCodec of statement kind S.
type codec[S nft.Stmt] struct {
	enc func(b *Batch, fam nft.Family, s S) error
	dec func(fam nft.Family, es []ExprState) []S
}

func (c codec[S]) kind() reflect.Type { return reflect.TypeFor[S]() }

func (c codec[S]) encode(b *Batch, fam nft.Family, s nft.Stmt) error { return c.enc(b, fam, s.(S)) }

func (c codec[S]) guess(fam nft.Family, es []ExprState) []nft.Stmt {
	var out []nft.Stmt
	for _, s := range c.dec(fam, es) {
		out = append(out, s)
	}
	return out
}

// stmtCodecs are the codecs in the order decoding tries their guesses: the first
// statement whose encoding matches wins (SetMarkBits with no bits encodes as its Xor
// form does, and decodes as the plain one).
var stmtCodecs = []stmtCodec{
	// a concatenation of loads ending in a lookup, dynset or numgen and lookup
	vmapCodec, lookupCodec, updateSaddrCodec, dnatKeyMapCodec, dnatHashCodec,
	prefixCodec, iifnameCodec, l4protoCodec, markUnsetCodec, setMarkCodec,
	ctStateNewCodec, ctStatusDNATCodec, fibDaddrCodec, fibSaddrCodec,
	verdictCodec, snatToCodec, dnatToCodec, rejectCodec, masqCodec, counterCodec,
	matchNumgenCodec, dnatNumgenCodec, ctStateEstablishedCodec, flowOffloadCodec,
}

// codecOf finds a statement's codec by its type.
var codecOf = func() map[reflect.Type]stmtCodec {
	m := make(map[reflect.Type]stmtCodec, len(stmtCodecs))
	for _, c := range stmtCodecs {
		if m[c.kind()] != nil {
			panic(fmt.Sprintf("wire: two codecs for %v", c.kind()))
		}
		m[c.kind()] = c
	}
	return m
}()

// stmt appends the expressions of one statement.
func (b *Batch) stmt(fam nft.Family, s nft.Stmt) error {
	c := codecOf[reflect.TypeOf(s)]
	if c == nil {
		return fmt.Errorf("wire: no encoding for statement %T", s)
	}
	return c.encode(b, fam, s)
}

// candidates are the statements the expressions could start with; decodeStmt keeps
// the first whose encoding matches.
func candidates(fam nft.Family, es []ExprState) []nft.Stmt {
	var out []nft.Stmt
	for _, c := range stmtCodecs {
		out = append(out, c.guess(fam, es)...)
	}
	return out
}

// at is es[i], or no expression past the end.
func at(es []ExprState, i int) ExprState {
	if i < len(es) {
		return es[i]
	}
	return ExprState{}
}

// leadingFields reads the loads es starts with as a concatenation of fields, and
// returns the index of the first expression after them.
func leadingFields(fam nft.Family, es []ExprState) ([]nft.Field, int) {
	var fields []nft.Field
	for i, e := range es {
		f, isLoad := loadField(fam, e)
		if !isLoad {
			return fields, i
		}
		fields = append(fields, f)
	}
	return fields, len(es)
}

// one is a guess of one statement, or none.
func one[S nft.Stmt](s S, ok bool) []S {
	if !ok {
		return nil
	}
	return []S{s}
}
