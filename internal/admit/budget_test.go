package admit

import (
	"fmt"
	"testing"
)

func TestFairShares(t *testing.T) {
	for _, tc := range []struct {
		demands      map[string]int
		total        int
		share, taken int
		over         string
	}{
		{map[string]int{"a": 10, "b": 20}, 30, 0, 30, "[]"}, // all fit: share is what is left
		{map[string]int{"a": 10, "b": 100, "c": 100}, 100, 45, 10, "[b c]"},
		{map[string]int{"a": 50, "b": 50}, 99, 49, 0, "[a b]"},
		{map[string]int{"a": 33, "b": 33, "c": 1000}, 100, 34, 66, "[c]"},
		{map[string]int{"a": 33, "b": 34, "c": 1000}, 100, 33, 33, "[b c]"}, // b needs more than half of the 67 a leaves
		{map[string]int{"x": 1000}, 100, 100, 0, "[x]"},
	} {
		var d []nsDemand
		for ns, c := range tc.demands {
			d = append(d, nsDemand{ns, c})
		}
		share, taken, over := fairShares(d, tc.total)
		if share != tc.share || taken != tc.taken || fmt.Sprint(over) != tc.over {
			t.Errorf("fairShares(%v, %d) = %d, %d, %v; want %d, %d, %s", tc.demands, tc.total, share, taken, over, tc.share, tc.taken, tc.over)
		}
	}
}
