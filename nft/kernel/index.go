package kernel

import (
	"fmt"
	"iter"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// The element index (state.elems) holds every element the kernel has, 750,000 at 30k
// services × 10 endpoints, so its layout is what its memory is (BenchmarkIndexMemory):
//
//   - each set's keys are fixed-size arrays (a set's key length is fixed by its
//     datatypes), not strings: no allocation per key, and no string header;
//   - an entry refers to the element that added the key last by position (elemRef: its
//     SetElements and index, 12 bytes, so that elements an nft.ElementSource builds
//     on demand are never stored), and holds the number of contributions in the
//     padding that is left: 16 bytes;
//   - whether a key's element changed is decided by comparing the old and new elements
//     (sameValue), for the keys a sync touches only, rather than by a fingerprint
//     stored with every key.

// maxKeyLen is the longest key nf_tables takes (NFT_DATA_VALUE_MAXLEN; a concatenation
// fills at most its 16 32-bit registers).
const maxKeyLen = 64

// elemKey is an element's encoded key (wire.AppendValues), zero-padded to maxKeyLen: an
// index takes the prefix its key size needs.
type elemKey struct {
	buf [maxKeyLen]byte
	n   int
}

// encode makes k the key of values vs in set s.
func (k *elemKey) encode(s *nft.Set, vs []nft.Value) error {
	b, err := wire.AppendValues(k.buf[:0], s.Key, vs)
	if err != nil {
		return err
	}
	if len(b) > maxKeyLen {
		return fmt.Errorf("key of %d bytes: nf_tables takes at most %d", len(b), maxKeyLen)
	}
	clear(k.buf[len(b):]) // what a longer key left in the buffer
	k.n = len(b)
	return nil
}

func (k *elemKey) bytes() []byte { return k.buf[:k.n] }

// keyOf returns the elemKey of key bytes (a key from elemDelta.before).
func keyOf(b string) (k elemKey) {
	k.n = copy(k.buf[:], b)
	return k
}

// elemRef refers to an element by position: element i of a ruleset's or part's
// SetElements, which may build it on demand (nft.ElementSource) rather than store it.
// Rulesets and parts are never modified once built, so the position stays valid.
type elemRef struct {
	se *nft.SetElements
	i  int32
}

// elem returns the element, built in buf when its SetElements has a source.
func (r elemRef) elem(buf *nft.ElementBuf) *nft.Element { return r.se.At(int(r.i), buf) }

// refElem is one key of a set: the element that added it last (in the ruleset or part
// that did) and the number of contributions. It is an index entry as is: 16 bytes.
type refElem struct {
	se   *nft.SetElements
	i    int32
	refs int32
}

func (r refElem) ref() elemRef { return elemRef{r.se, r.i} }

// setIndex is the elements of one set by key. Every key has the length the index was
// made for (keyLen): callers check, since a shorter key, zero-padded, would be taken
// for a longer one that ends in zeros.
type setIndex interface {
	keyLen() int
	get(k *elemKey) (refElem, bool)
	put(k *elemKey, e refElem)
	del(k *elemKey)
	len() int
	refs() iter.Seq[elemRef]
}

// newIndex returns an empty index for keys of klen bytes with room for hint of them.
// The key sizes fit nftproxy's sets: 8 (IPv4 hairpin), 16 (IPv4 frontends and
// endpoint keys), 24 (IPv6 frontends), 32 (IPv6 endpoint and hairpin keys); they are
// multiples of 8 because an entry's pointer aligns it to 8 bytes anyway.
func newIndex(klen, hint int) setIndex {
	switch {
	case klen <= 8:
		return newFixedIndex[[8]byte](klen, hint)
	case klen <= 16:
		return newFixedIndex[[16]byte](klen, hint)
	case klen <= 24:
		return newFixedIndex[[24]byte](klen, hint)
	case klen <= 32:
		return newFixedIndex[[32]byte](klen, hint)
	case klen <= 48:
		return newFixedIndex[[48]byte](klen, hint)
	}
	return newFixedIndex[[maxKeyLen]byte](klen, hint)
}

type fixedKey interface {
	[8]byte | [16]byte | [24]byte | [32]byte | [48]byte | [maxKeyLen]byte
}

// fixedIndex is a setIndex whose keys are K arrays.
type fixedIndex[K fixedKey] struct {
	klen int
	m    map[K]refElem
}

func newFixedIndex[K fixedKey](klen, hint int) *fixedIndex[K] {
	return &fixedIndex[K]{klen: klen, m: make(map[K]refElem, hint)}
}

// key is k as a K: its first len(K) bytes, zero beyond k.n.
func (x *fixedIndex[K]) key(k *elemKey) K { return K(k.buf[:]) }

func (x *fixedIndex[K]) keyLen() int { return x.klen }

func (x *fixedIndex[K]) len() int { return len(x.m) }

func (x *fixedIndex[K]) get(k *elemKey) (refElem, bool) {
	e, ok := x.m[x.key(k)]
	return e, ok
}

func (x *fixedIndex[K]) put(k *elemKey, e refElem) { x.m[x.key(k)] = e }

func (x *fixedIndex[K]) del(k *elemKey) { delete(x.m, x.key(k)) }

func (x *fixedIndex[K]) refs() iter.Seq[elemRef] {
	return func(yield func(elemRef) bool) {
		for _, e := range x.m {
			if !yield(e.ref()) {
				return
			}
		}
	}
}

// sameValue reports whether two elements of set s with the same key are the same to the
// kernel, value (verdict or data, as encoded) and comment: replacing one with the other
// needs no update.
func sameValue(s *nft.Set, a, b *nft.Element) bool {
	if a == b { // the same stored element
		return true
	}
	if a.Comment != b.Comment || (a.Verdict == nil) != (b.Verdict == nil) {
		return false
	}
	if a.Verdict != nil {
		return a.Verdict.Kind == b.Verdict.Kind && a.Verdict.Chain == b.Verdict.Chain
	}
	if len(a.Data) == 0 && len(b.Data) == 0 {
		return true
	}
	types := s.Data
	if s.Interval { // a range's last address
		types = s.Key
	}
	var ab, bb [maxKeyLen]byte
	ad, errA := wire.AppendValues(ab[:0], types, a.Data)
	bd, errB := wire.AppendValues(bb[:0], types, b.Data)
	return errA == nil && errB == nil && string(ad) == string(bd)
}
