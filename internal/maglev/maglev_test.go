package maglev

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func maglevKeys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.244.%d.%d:8080", i/250, 1+i%250)
	}
	return out
}

// TestTable: every entry filled, shares within the bound of the table size, the
// same table whatever the order of the endpoints, and removing one of ten endpoints
// moves at most 12 % of 10,000 hash inputs (a random choice would move about 90 %).
func TestTable(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 41, 100, 200, 1000} {
		keys := maglevKeys(n)
		m := Size(n)
		tab := Table(keys, m)
		if len(tab) != m {
			t.Fatalf("n=%d: table of %d entries, want %d", n, len(tab), m)
		}
		count := make([]int, n)
		for _, e := range tab {
			if e < 0 || e >= n {
				t.Fatalf("n=%d: entry %d", n, e)
			}
			count[e]++
		}
		fair := float64(m) / float64(n)
		lo, hi := slices.Min(count), slices.Max(count)
		if n*100 <= MaxSize && (float64(hi) > fair*1.1+1 || float64(lo) < fair*0.9-1) {
			t.Errorf("n=%d m=%d: shares %d..%d, fair %.1f", n, m, lo, hi, fair)
		}
		shuffled := slices.Clone(keys)
		rand.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		tab2 := Table(shuffled, m)
		for i := range tab {
			if keys[tab[i]] != shuffled[tab2[i]] {
				t.Fatalf("n=%d: entry %d differs with the endpoints in another order", n, i)
			}
		}
	}
	if Table(nil, 61) != nil {
		t.Error("no endpoints: want no table")
	}

	keys := maglevKeys(10)
	m := Size(10)
	before := Table(keys, m)
	removed := 3
	rest := slices.Delete(slices.Clone(keys), removed, removed+1)
	after := Table(rest, m)
	const inputs = 10000
	rng := rand.New(rand.NewPCG(1, 2))
	moved, onRemoved := 0, 0
	for range inputs {
		b := rng.IntN(m)
		if keys[before[b]] != rest[after[b]] {
			moved++
		}
		if before[b] == removed {
			onRemoved++
		}
	}
	frac := float64(moved) / inputs
	t.Logf("10 → 9 endpoints, table %d: %.1f %% of %d inputs moved (%.1f %% were on the removed endpoint)", m, 100*frac, inputs, 100*float64(onRemoved)/inputs)
	if frac > 0.12 {
		t.Errorf("%.1f %% of flows moved, want at most 12 %%", 100*frac)
	}
}
