package sandbox

import (
	"context"
	"log/slog"
	"sync"
	"testing"
)

// oneRecord is Records holding one record; before runs inside Update,
// before fn, as a write that crosses it would.
type oneRecord struct {
	mu     sync.Mutex
	r      Record
	before func()
}

func (o *oneRecord) Insert(context.Context, Record) error { return nil }
func (o *oneRecord) Get(context.Context, string) (Record, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.r, nil
}
func (o *oneRecord) List(context.Context) ([]Record, error) { return nil, nil }
func (o *oneRecord) Delete(context.Context, string) error   { return nil }
func (o *oneRecord) Take(ctx context.Context, id string, fn func(*Record) error) (Record, error) {
	return o.Update(ctx, id, fn)
}
func (o *oneRecord) Update(_ context.Context, _ string, fn func(*Record) error) (Record, error) {
	if b := o.before; b != nil {
		o.before = nil
		b()
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	err := fn(&o.r)
	return o.r, err
}

// TestStaleSessionWordIgnored pins a race of issue 17's heal: session
// 1's failure (answering false) crossed session 2's answer (true), and
// its record write landed after the heal: each session tells its answer
// once, so the sandbox stayed unresponsive and was stopped at its limit
// while its guest answered. A failure is written only while its session
// is the newest that told; a word of an older session is ignored.
func TestStaleSessionWordIgnored(t *testing.T) {
	for _, tc := range []struct {
		name string
		// words are told in order; cross is told inside the first
		// word's record write.
		words []word
		cross *word
		want  State
	}{
		{"a failure alone", []word{{1, false}}, nil, Unresponsive},
		{"a failure after the same session's answer", []word{{1, true}, {1, false}}, nil, Unresponsive},
		{"a newer session's failure", []word{{2, true}, {3, false}}, nil, Unresponsive},
		{"an older session's failure after a newer one's answer", []word{{2, true}, {1, false}}, nil, Running},
		{"an older session's failure crossing a newer one's answer", []word{{1, false}}, &word{2, true}, Running},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			rec := &oneRecord{r: Record{ID: "sb-1", State: Running}}
			m := &Manager{ctx: ctx, cfg: Config{Records: rec}, log: slog.New(slog.DiscardHandler), closed: true}
			// A heal under way: an answer asks for another (again),
			// and the record is left to this test.
			mc := &machine{id: "sb-1", healing: true}
			if tc.cross != nil {
				rec.before = func() { m.answering(mc, tc.cross.n, tc.cross.up) }
			}
			for _, w := range tc.words {
				m.answering(mc, w.n, w.up)
			}
			if got := rec.r.State; got != tc.want {
				t.Fatalf("state %s, want %s", got, tc.want)
			}
		})
	}
}

type word struct {
	n  uint64
	up bool
}
