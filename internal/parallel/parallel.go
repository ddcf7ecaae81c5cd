// Package parallel runs the iterations of a loop on a few goroutines.
package parallel

import "sync"

// For calls f(i) for every i in [0, n), on up to workers goroutines
// (at least one), each taking the next i not yet taken, and returns when
// every call has.
func For(n, workers int, f func(i int)) {
	next := make(chan int, n)
	for i := range n {
		next <- i
	}
	close(next)
	var wg sync.WaitGroup
	for range max(1, min(n, workers)) {
		wg.Go(func() {
			for i := range next {
				f(i)
			}
		})
	}
	wg.Wait()
}
