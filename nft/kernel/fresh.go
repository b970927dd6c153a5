package kernel

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/par"
	"github.com/nftproxy/nftproxy/nft/wire"
)

// A full write (diffFull) adds every element of every set. fillFresh does it in one
// pass over the elements, set by set, the sets shared among GOMAXPROCS goroutines:
// each element is built once (an nft.ElementSource builds it on demand), its key
// counted in its set's index and, the first time the key is seen, encoded into the
// set's own batch. The applier's first sync of a 10,000-service node used to build
// every element twice (index, then message, the message's in the index's random
// order) on one core.

// freshSet is one set's share of a full write.
type freshSet struct {
	s     *nft.Set
	m     setIndex
	from  []*nft.SetElements // its contributions: the ruleset's own, then the parts'
	n     int                // their elements, duplicates included
	b     *wire.Batch        // the messages adding its elements
	rs    *nft.Ruleset       // the table's
	added int
	err   error
}

// fillFresh indexes and encodes the elements of every set of cur, making each set's
// index sized by its contributions once (growing maps of hundreds of thousands of keys
// doubled the peak memory of a cold sync), and returns, in set-name order, one batch of
// element messages per set with elements, and how many elements they add.
func fillFresh(cur *state, byName map[string]*nft.Set) ([]*wire.Batch, int, error) {
	rs := cur.rs
	jobs := map[string]*freshSet{}
	contribute := func(s *nft.Set, se *nft.SetElements) {
		n := se.Len()
		if n == 0 {
			return
		}
		j := jobs[s.Name]
		if j == nil {
			j = &freshSet{s: s, b: wire.NewBatch(rs.Family, rs.Table), rs: rs}
			jobs[s.Name] = j
		}
		j.from = append(j.from, se)
		j.n += n
	}
	for _, s := range rs.Sets {
		contribute(s, ownElements(s))
	}
	for _, p := range rs.Parts {
		for i := range p.Elements {
			se := &p.Elements[i]
			s := byName[se.Set]
			if s == nil {
				return nil, 0, fmt.Errorf("part %s: elements for set %s, which the ruleset does not define", p.Owner, se.Set)
			}
			contribute(s, se)
		}
	}
	order := make([]*freshSet, 0, len(jobs))
	for _, j := range jobs {
		j.m = newIndex(wire.KeyLen(j.s.Key), j.n)
		cur.elems[j.s.Name] = j.m
		order = append(order, j)
	}
	// the biggest first, so that the goroutines end together
	slices.SortFunc(order, func(a, b *freshSet) int { return cmp.Compare(b.n, a.n) })
	par.Each(len(order), 1, func(i int) {
		var f filler
		order[i].err = f.fill(order[i])
	})
	slices.SortFunc(order, func(a, b *freshSet) int { return cmp.Compare(a.s.Name, b.s.Name) })
	out := make([]*wire.Batch, 0, len(order))
	added := 0
	for _, j := range order {
		if j.err != nil {
			return nil, 0, j.err
		}
		out = append(out, j.b)
		added += j.added
	}
	return out, added, nil
}

// filler is one goroutine's scratch.
type filler struct {
	k          elemKey
	buf, other nft.ElementBuf
}

// fill indexes and encodes j's elements. A key that two contributions give different
// values (parts share keys only with identical elements) ends with the last one
// counted in the index, as in elemDelta.add; the set is then encoded again from its
// index, so that the kernel gets that one too.
func (f *filler) fill(j *freshSet) error {
	w := j.b.Stream(j.s, false)
	w.Expect(j.n)
	differ := false
	for _, se := range j.from {
		for i := range se.Len() {
			e := se.At(i, &f.buf)
			if err := key(&f.k, j.m, j.s, e); err != nil {
				return err
			}
			cur, had := j.m.get(&f.k)
			if had && !differ && !sameValue(j.s, cur.ref().elem(&f.other), e) {
				differ = true
			}
			cur.se, cur.i = se, int32(i)
			cur.refs++
			j.m.put(&f.k, cur)
			if !had {
				if err := w.Add(e); err != nil {
					return err
				}
				j.added++
			}
		}
	}
	w.Close()
	if !differ {
		return nil
	}
	j.b = wire.NewBatch(j.rs.Family, j.rs.Table)
	w = j.b.Stream(j.s, false)
	for r := range j.m.refs() {
		if err := w.Add(r.elem(&f.buf)); err != nil {
			return err
		}
	}
	w.Close()
	return nil
}
