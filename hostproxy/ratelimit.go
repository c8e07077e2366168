package hostproxy

import (
	"math"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// limiters keeps one token bucket per key (a credential, or a client
// address and key prefix for failed authentications: failureBucket). Buckets idle for longer than it
// takes to refill are dropped when the map grows, so the map stays small
// without a background goroutine.
type limiters struct {
	limit rate.Limit
	burst int

	mu      sync.Mutex
	buckets map[string]*bucket
	// nextSweep spaces sweeps: a full sweep per new key once the map is
	// over limiterSweepAt would make a flood of new keys (one per client
	// address of an IPv6 range) quadratic, under the mutex.
	nextSweep time.Time
	sweeps    int // sweeps done, for tests
}

type bucket struct {
	lim  *rate.Limiter
	last time.Time
}

const (
	limiterSweepAt    = 4096
	limiterSweepEvery = time.Second
)

func newLimiters(perSecond float64, burst int) *limiters {
	return &limiters{limit: rate.Limit(perSecond), burst: burst, buckets: map[string]*bucket{}}
}

// allow takes one token from key's bucket. When none is left it returns
// false and how long until one is.
func (l *limiters) allow(key string, now time.Time) (bool, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	b := l.buckets[key]
	if b == nil {
		if len(l.buckets) >= limiterSweepAt && !now.Before(l.nextSweep) {
			l.sweep(now)
			l.nextSweep = now.Add(limiterSweepEvery)
		}
		b = &bucket{lim: rate.NewLimiter(l.limit, l.burst)}
		l.buckets[key] = b
	}
	b.last = now
	r := b.lim.ReserveN(now, 1)
	if !r.OK() {
		return false, time.Second
	}
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// sweep drops buckets that have been idle long enough to be full again.
func (l *limiters) sweep(now time.Time) {
	l.sweeps++
	full := time.Duration(float64(l.burst)/float64(l.limit)*float64(time.Second)) + time.Second
	for k, b := range l.buckets {
		if now.Sub(b.last) > full {
			delete(l.buckets, k)
		}
	}
}

// retryAfterSeconds rounds a wait up to whole seconds, at least 1, as the
// Retry-After header wants.
func retryAfterSeconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return s
}
