package hostproxy

import (
	"runtime"
	rtmetrics "runtime/metrics"
)

// guestHeapBound is what one hostile guest may make hostproxy hold at
// once (docs/design.md, "What a guest can make the host hold").
const guestHeapBound = 128 << 20

// heapWatch samples the live heap (what the last collection marked,
// runtime/metrics' /gc/heap/live:bytes) after collection after
// collection until stop is called, which returns the most it saw above
// the live heap at the start. Sampling can miss a peak; it can also
// count as live what was allocated while a collection marked (one more
// answer of a guest, when calls follow each other), so a bound on it
// leaves room for that. Neither depends on the machine's speed.
func heapWatch() (stop func() (peak int64)) {
	live := func() int64 {
		runtime.GC()
		s := []rtmetrics.Sample{{Name: "/gc/heap/live:bytes"}}
		rtmetrics.Read(s)
		return int64(s[0].Value.Uint64())
	}
	base := live()
	done, out := make(chan struct{}), make(chan int64)
	go func() {
		var peak int64
		for {
			peak = max(peak, live()-base)
			select {
			case <-done:
				out <- peak
				return
			default:
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-out
	}
}
