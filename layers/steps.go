package layers

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"strata/internal/failpoint"
	"strata/internal/servertiming"
)

// Operation and step names. They are shared by the logs, the failpoints
// ("<op>.<step>", hit right after a step succeeds), guestd's metrics and
// docs/design.md, so they are constants, never spelled out twice.
const (
	opEnroll         = "enroll"
	opCapture        = "capture"
	opRestore        = "restore"
	opDelete         = "delete"
	opCompact        = "compact"
	opSquash         = "squash"
	opRecoverEnroll  = "recover.enroll"
	opRecoverCapture = "recover.capture"
	opClone          = "clone"
	opRelease        = "release"
	opRecoverClone   = "recover.clone"
	opRecoverRelease = "recover.release"
	opRestorePaths   = "restore-paths"

	stepValidatePath   = "validate.path"
	stepValidateMounts = "validate.mounts"
	stepValidateLayer  = "validate.layer"
	stepBusyCheck      = "busy.check"
	stepBusyGate       = "busy.gate"
	stepSpaceCheck     = "space.check"
	stepPrepare        = "prepare"
	stepIntent         = "intent"
	stepExchange       = "exchange"
	stepImmutable      = "immutable"
	stepSync           = "sync"
	stepCommit         = "commit"
	stepMount          = "mount"
	stepMountCheck     = "mount.check"
	stepMountSwap      = "mount.swap"
	stepFreeze         = "freeze"
	stepSeal           = "seal"
	stepCompact        = "compact"
	stepMerge          = "merge"
	stepCollect        = "collect"
	stepPlace          = "place"
	stepMaterialize    = "materialize"
	stepUnmount        = "unmount"
)

// fpCollectTrashed is a failpoint inside cleanup: a layer dir is in
// trash/, not yet deleted.
const fpCollectTrashed = "collect.trashed"

// op runs the named steps of one operation: each step is logged at debug
// with its duration and is a failpoint right after it succeeds; the
// operation ends with one info line that carries every step's duration.
type op struct {
	ctx   context.Context
	log   *slog.Logger
	name  string
	start time.Time
	hook  func(op, step string, d time.Duration, err error)
	steps []string // "name=ms" of each step run
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
	err := classifyNoSpace(fn())
	d := time.Since(t)
	o.steps = append(o.steps, fmt.Sprintf("%s=%.3f", name, ms(d)))
	// The request's Server-Timing, when an HTTP request runs the op.
	servertiming.Add(o.ctx, o.name+"."+name, d)
	if o.hook != nil {
		o.hook(o.name, name, d, err)
	}
	if err != nil {
		o.log.Debug("step failed", "step", name, "ms", ms(d), "err", err)
		return err
	}
	o.log.Debug("step", "step", name, "ms", ms(d))
	failpoint.Hit(o.name + "." + name)
	return nil
}

// done logs the whole operation in one line.
func (o *op) done(err error) {
	steps := strings.Join(o.steps, " ")
	if err != nil {
		o.log.Info("operation failed", "duration_ms", ms(time.Since(o.start)), "steps", steps, "err", err)
		return
	}
	o.log.Info("operation done", "duration_ms", ms(time.Since(o.start)), "steps", steps)
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
