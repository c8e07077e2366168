package guestd

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"strata/internal/httpx"
	"strata/internal/jsend"
)

// Limits of a resync's seed, in bytes (decoded). 32 bytes is the 256 bits
// the kernel's CRNG wants to be seeded; 512 is far more than it can use.
const (
	minResyncSeed = 32
	maxResyncSeed = 512
)

// resyncRequest is a checked POST /v1/resync body: the plan that
// applyResync carries out.
type resyncRequest struct {
	// TimeUnixNano is the host's wall clock, the guest's CLOCK_REALTIME
	// to be (> 0).
	TimeUnixNano int64
	// Seed is fresh randomness from the host, minResyncSeed to
	// maxResyncSeed bytes, mixed into the guest kernel's RNG.
	Seed []byte
	// Hostname is the guest's new hostname; "" keeps the one it has.
	Hostname string
	// Continues is set when the guest's memory is its own run going on
	// (a resume of its pause, a guestd that answers again): its sessions
	// keep their generation. Otherwise (a restore, a fork) they are
	// another run's.
	Continues bool
}

// resyncWire is the body as sent: pointers tell a field left out (or
// null) from one sent empty or zero.
type resyncWire struct {
	TimeUnixNano *int64  `json:"time_unix_nano"`
	Seed         *string `json:"seed"`
	Hostname     *string `json:"hostname"`
	Continues    *bool   `json:"continues"`
}

// resyncResult is the data of a resync's 200 answer.
type resyncResult struct {
	// ClockStepNS is the guest's CLOCK_REALTIME after minus before the
	// step: how far behind (positive) or ahead the guest's clock was.
	ClockStepNS int64 `json:"clock_step_ns"`
	// Reseeded is true when the kernel's CRNG was forced to reseed at
	// once (RNDRESEEDCRNG); false on a kernel without that ioctl, where
	// the seed is mixed in but used only at the CRNG's next reseed.
	Reseeded bool `json:"reseeded"`
	// Hostname is the guest's hostname after the call.
	Hostname string `json:"hostname"`
}

// parseResync decodes and checks a POST /v1/resync body. The body is
// exactly one JSON object (invalid_json, unknown_field, invalid_field for
// a wrong type) of at most jsend.MaxBody bytes (body_too_large), and:
//
//   - time_unix_nano is required: an integer > 0, nanoseconds since 1970;
//   - seed is required: standard, padded base64 (the one encoding of its
//     bytes: no line breaks, no stray bits) of minResyncSeed to
//     maxResyncSeed bytes;
//   - hostname is optional: one RFC 1123 label, 1 to 63 ASCII letters,
//     digits and hyphens, neither first nor last a hyphen;
//   - continues is optional (false): true when the guest's memory goes on
//     with its own run, and its sessions' generation stays.
//
// A null field is a field left out. Each broken rule is invalid_field
// naming the field.
func parseResync(body []byte) (resyncRequest, error) {
	if len(body) > jsend.MaxBody {
		return resyncRequest{}, jsend.ErrBodyTooLarge
	}
	var w resyncWire
	if err := jsend.DecodeBytes(body, &w); err != nil {
		return resyncRequest{}, err
	}
	var req resyncRequest

	if w.TimeUnixNano == nil {
		return resyncRequest{}, jsend.InvalidField("time_unix_nano", "time_unix_nano is required: the host's wall clock, in nanoseconds since 1970")
	}
	if req.TimeUnixNano = *w.TimeUnixNano; req.TimeUnixNano <= 0 {
		return resyncRequest{}, jsend.InvalidField("time_unix_nano", "time_unix_nano must be a positive number of nanoseconds since 1970")
	}

	if w.Seed == nil {
		return resyncRequest{}, jsend.InvalidField("seed", "seed is required: 32 to 512 random bytes, in base64")
	}
	seed, err := base64.StdEncoding.DecodeString(*w.Seed)
	// The decoder skips line breaks and accepts stray bits in the last
	// character: only the one encoding of the bytes is accepted.
	if err != nil || base64.StdEncoding.EncodeToString(seed) != *w.Seed {
		return resyncRequest{}, jsend.InvalidField("seed", "seed must be standard, padded base64 without line breaks")
	}
	if len(seed) < minResyncSeed || len(seed) > maxResyncSeed {
		return resyncRequest{}, jsend.InvalidField("seed", "seed must be 32 to 512 bytes").With("limit", maxResyncSeed)
	}
	req.Seed = seed

	if w.Hostname != nil {
		if !validHostname(*w.Hostname) {
			return resyncRequest{}, jsend.InvalidField("hostname", "hostname must be 1 to 63 letters, digits and hyphens, neither first nor last a hyphen")
		}
		req.Hostname = *w.Hostname
	}
	req.Continues = w.Continues != nil && *w.Continues
	return req, nil
}

// validHostname reports whether name is one RFC 1123 label: 1 to 63
// ASCII letters, digits and hyphens, not starting or ending with a hyphen.
func validHostname(name string) bool {
	if len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// randPoolInfo lays out the kernel's struct rand_pool_info for
// RNDADDENTROPY: int entropy_count (bits credited), int buf_size (bytes),
// then buf, in the machine's byte order. Every seed byte is credited as
// 8 bits: the host drew it from its own CRNG.
func randPoolInfo(seed []byte) []byte {
	b := make([]byte, 8+len(seed))
	binary.NativeEndian.PutUint32(b[0:4], uint32(8*len(seed)))
	binary.NativeEndian.PutUint32(b[4:8], uint32(len(seed)))
	copy(b[8:], seed)
	return b
}

// resyncKernel is the guest's kernel as a resync changes it: the real one
// (linuxKernel) in a microVM, a fake in tests. Each method is one system
// call, and its error is the call's, wrapped with the operation.
type resyncKernel interface {
	// realtime reads CLOCK_REALTIME, in nanoseconds since 1970.
	realtime() (int64, error)
	// setRealtime sets CLOCK_REALTIME.
	setRealtime(ns int64) error
	// addEntropy mixes a rand_pool_info (randPoolInfo) into the kernel's
	// RNG and credits its entropy (RNDADDENTROPY).
	addEntropy(poolInfo []byte) error
	// reseed makes the kernel's CRNG reseed now (RNDRESEEDCRNG).
	reseed() error
	// setHostname sets the hostname of guestd's UTS namespace.
	setHostname(name string) error
	// hostname reads it.
	hostname() (string, error)
}

// resync handles POST /v1/resync, served only inside a strata microVM
// (Config.PowerOff set). The host calls it when the guest's memory is not
// its own last moment: after a restore from a memory snapshot (the wall
// clock stopped when the snapshot was taken) or a fork (the kernel's RNG
// state is a copy of its siblings', so they would draw the same numbers).
// A kernel told of a fork by a VM generation id (vmgenid: Linux 5.18 and
// later, when the VMM offers one) reseeds on its own; this covers the
// others, and the clock, which nothing else steps.
//
// In order, each a named step (logged, timed in
// strata_guestd_step_seconds under op "resync"):
//
//   - clock.set: CLOCK_REALTIME becomes time_unix_nano, first, so that all
//     that follows (this request's own logs included) reads the host's
//     time. The step answered is new minus old, both read here; the time
//     the request took in transit is not made up for. A time the kernel
//     refuses (before the guest booted, or past its limit, about 2232) is
//     invalid_field;
//   - rng.seed: the seed is mixed into the kernel's RNG and credited in
//     full (RNDADDENTROPY on /dev/urandom);
//   - rng.reseed: the CRNG is made to reseed from it now (RNDRESEEDCRNG).
//     A kernel without that ioctl (before 4.17: ENOTTY or EINVAL) is
//     logged and answered with reseeded false: the seed is in the pool,
//     but the CRNG draws from it only at its next scheduled reseed;
//   - hostname.set: when hostname is sent.
//
// Before them all, the sessions' generation is drawn again (session.go),
// unless the call says the guest continues its own run (a resume of its
// pause, a heal): attachments that name the old one are refused with
// session_restored.
//
// A failed step stops the call with the steps before it done. Each step
// is safe to repeat, so the host retries the whole call, with its time
// read again, never a part of it.
//
// What it does not do: reach processes' own generators (a user-space PRNG
// seeded before the snapshot keeps its state) or touch CLOCK_MONOTONIC
// (guestd's own timeouts use it); timers on CLOCK_REALTIME in the guest
// fire by the stepped clock. Calls are serialized: two at once would each
// answer a step measured against the other's clock.
func (s *Server) resync(r *http.Request) (any, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return nil, err
	}
	body, err := jsend.ReadBody(r, jsend.MaxBody, jsend.ErrBodyTooLarge)
	if err != nil {
		return nil, err
	}
	req, err := parseResync(body)
	if err != nil {
		return nil, err
	}
	res, err := s.applyResync(req)
	if err != nil {
		return nil, err
	}
	httpx.Annotate(r.Context(), slog.Int64("clock_step_ns", res.ClockStepNS), slog.Bool("reseeded", res.Reseeded))
	return res, nil
}

// applyResync carries out req on s.kernel, step by step (see resync).
func (s *Server) applyResync(req resyncRequest) (resyncResult, error) {
	s.resyncMu.Lock()
	defer s.resyncMu.Unlock()
	// The seed is the guest's future randomness: no copy outlives the call.
	defer clear(req.Seed)
	// The guest's memory was loaded again: its sessions are another run's
	// from now on (session.go), whatever the steps below do.
	var generation string
	if s.sessions != nil && !req.Continues {
		generation = s.sessions.renew()
	}
	k := s.kernel
	start := time.Now()
	var steps []string
	step := func(name string, fn func() error) error {
		t := time.Now()
		err := fn()
		d := time.Since(t)
		steps = append(steps, fmt.Sprintf("%s=%.3f", name, float64(d.Microseconds())/1000))
		if s.metrics != nil {
			s.metrics.observeStep("resync", name, d, err)
		}
		if err != nil {
			s.log.Debug("step failed", "op", "resync", "step", name, "err", err)
		}
		return err
	}
	var res resyncResult
	err := func() error {
		if err := step("clock.set", func() error {
			old, err := k.realtime()
			if err != nil {
				return err
			}
			if err := k.setRealtime(req.TimeUnixNano); err != nil {
				if errors.Is(err, unix.EINVAL) {
					return jsend.InvalidField("time_unix_nano", "the guest's kernel refuses to set its clock to time_unix_nano").Wrap(err)
				}
				return err
			}
			res.ClockStepNS = req.TimeUnixNano - old
			return nil
		}); err != nil {
			return err
		}
		poolInfo := randPoolInfo(req.Seed)
		defer clear(poolInfo)
		if err := step("rng.seed", func() error { return k.addEntropy(poolInfo) }); err != nil {
			return err
		}
		if err := step("rng.reseed", func() error {
			err := k.reseed()
			if errors.Is(err, unix.ENOTTY) || errors.Is(err, unix.EINVAL) {
				s.log.Warn("resync: this kernel cannot be made to reseed at once (RNDRESEEDCRNG); the seed is mixed in and used at its next reseed", "err", err)
				return nil
			}
			res.Reseeded = err == nil
			return err
		}); err != nil {
			return err
		}
		if req.Hostname != "" {
			if err := step("hostname.set", func() error { return k.setHostname(req.Hostname) }); err != nil {
				return err
			}
		}
		name, err := k.hostname()
		res.Hostname = name
		return err
	}()
	attrs := []any{"duration_ms", float64(time.Since(start).Microseconds()) / 1000, "steps", strings.Join(steps, " ")}
	if err != nil {
		s.log.Info("resync failed", append(attrs, "err", err)...)
		return resyncResult{}, err
	}
	s.log.Info("resync done", append(attrs, "clock_step_ns", res.ClockStepNS, "reseeded", res.Reseeded, "hostname", res.Hostname, "generation", generation)...)
	return res, nil
}
