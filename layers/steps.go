package layers

import (
	"context"
	"log/slog"
	"time"

	"strata/internal/failpoint"
)

// op runs the named steps of one operation: each step is logged with its
// duration, and is a failpoint ("<op>.<step>") right after it succeeds.
type op struct {
	ctx   context.Context
	log   *slog.Logger
	name  string
	start time.Time
	hook  func(op, step string, d time.Duration, err error)
}

func (s *Store) newOp(ctx context.Context, name, path string) *op {
	return &op{ctx: ctx, log: s.log.With("op", name, "path", path), name: name, start: time.Now(), hook: s.cfg.StepHook}
}

// step runs fn as the named step.
func (o *op) step(name string, fn func() error) error {
	if err := o.ctx.Err(); err != nil {
		return err
	}
	t := time.Now()
	err := fn()
	d := time.Since(t)
	if o.hook != nil {
		o.hook(o.name, name, d, err)
	}
	if err != nil {
		o.log.Info("step failed", "step", name, "ms", ms(d), "err", err)
		return err
	}
	o.log.Info("step", "step", name, "ms", ms(d))
	failpoint.Hit(o.name + "." + name)
	return nil
}

// done logs the whole operation.
func (o *op) done(err error) {
	if err != nil {
		o.log.Info("operation failed", "ms", ms(time.Since(o.start)), "err", err)
		return
	}
	o.log.Info("operation done", "ms", ms(time.Since(o.start)))
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
