// Package par runs pieces of one computation on several goroutines. A panic in a piece
// is raised again in the caller, so that whoever recovers the caller's panics (the sync
// loop does) recovers it too, instead of the whole process ending.
package par

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
)

// Panic is what the caller panics with when a piece panicked: the piece's value and
// its goroutine's stack.
type Panic struct {
	Value any
	Stack []byte
}

func (p *Panic) String() string { return fmt.Sprintf("%v\n\n%s", p.Value, p.Stack) }

// Do runs the functions at once, each on its own goroutine, and returns when all have.
func Do(fns ...func()) {
	var wg sync.WaitGroup
	var first atomic.Pointer[Panic]
	for _, f := range fns {
		wg.Go(func() {
			defer catch(&first)
			f()
		})
	}
	wg.Wait()
	if p := first.Load(); p != nil {
		panic(p)
	}
}

// Each calls f(i) for every i in [0, n), on up to GOMAXPROCS goroutines that take
// chunk consecutive indexes at a time, and returns when all calls have. f must be safe
// to call at once for different indexes.
func Each(n, chunk int, f func(i int)) {
	workers := min(runtime.GOMAXPROCS(0), (n+chunk-1)/chunk)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var first atomic.Pointer[Panic]
	for range workers {
		wg.Go(func() {
			defer catch(&first)
			for {
				end := int(next.Add(int64(chunk)))
				start := end - chunk
				if start >= n || first.Load() != nil {
					return
				}
				for i := start; i < min(end, n); i++ {
					f(i)
				}
			}
		})
	}
	wg.Wait()
	if p := first.Load(); p != nil {
		panic(p)
	}
}

func catch(first *atomic.Pointer[Panic]) {
	if v := recover(); v != nil {
		first.CompareAndSwap(nil, &Panic{Value: v, Stack: debug.Stack()})
	}
}
