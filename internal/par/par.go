// Package par is nft/par for the packages under internal/: the pieces of one
// computation on several goroutines, a piece's panic raised again in the caller.
package par

import "github.com/nftproxy/nftproxy/nft/par"

// Panic is what the caller panics with when a piece panicked.
type Panic = par.Panic

// Do runs the functions at once, each on its own goroutine (par.Do).
func Do(fns ...func()) { par.Do(fns...) }

// Each calls f(i) for every i in [0, n) on up to GOMAXPROCS goroutines (par.Each).
func Each(n, chunk int, f func(i int)) { par.Each(n, chunk, f) }
