package par

import (
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
)

func TestEachCallsEveryIndexOnce(t *testing.T) {
	for _, tc := range []struct{ n, chunk int }{{0, 4}, {1, 4}, {5, 1}, {1000, 7}, {4096, 256}} {
		calls := make([]atomic.Int32, tc.n)
		Each(tc.n, tc.chunk, func(i int) { calls[i].Add(1) })
		for i := range calls {
			if c := calls[i].Load(); c != 1 {
				t.Fatalf("n=%d chunk=%d: index %d called %d times", tc.n, tc.chunk, i, c)
			}
		}
	}
}

func TestDoRunsAll(t *testing.T) {
	var a, b atomic.Bool
	Do(func() { a.Store(true) }, func() { b.Store(true) })
	if !a.Load() || !b.Load() {
		t.Fatalf("ran %v %v", a.Load(), b.Load())
	}
}

// A panic on a worker goroutine reaches the caller, where it can be recovered, with the
// worker's stack.
func TestPanicReachesCaller(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(4)) // workers even on a one-CPU machine
	for name, run := range map[string]func(){
		"Each": func() {
			Each(1000, 3, func(i int) {
				if i == 500 {
					panic("bad object 500")
				}
			})
		},
		"Do": func() { Do(func() {}, func() { panic("bad object") }) },
	} {
		func() {
			defer func() {
				v := recover()
				p, ok := v.(*Panic)
				if !ok || !strings.HasPrefix(p.String(), "bad object") || !strings.Contains(string(p.Stack), "par_test.go") {
					t.Errorf("%s: recovered %v", name, v)
				}
			}()
			run()
			t.Errorf("%s: returned", name)
		}()
	}
}
