package guestd

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"strata/internal/fault"
	"strata/layers"
)

type metrics struct {
	ops   *prometheus.CounterVec
	opDur *prometheus.HistogramVec
	steps *prometheus.HistogramVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "strata_guestd_operations_total",
			Help: "Checkpoint operations by kind and result code (ok, or the error code).",
		}, []string{"op", "code"}),
		opDur: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "strata_guestd_operation_seconds",
			Help:    "Duration of checkpoint operations.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"op"}),
		steps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "strata_guestd_step_seconds",
			Help:    "Duration of each named step of each operation.",
			Buckets: prometheus.ExponentialBuckets(0.00005, 2, 20),
		}, []string{"op", "step"}),
	}
	reg.MustRegister(m.ops, m.opDur, m.steps)
	return m
}

func (m *metrics) observeStep(op, step string, d time.Duration, err error) {
	m.steps.WithLabelValues(op, step).Observe(d.Seconds())
}

func (s *Server) observe(op string, fn func() (layers.Checkpoint, error)) (layers.Checkpoint, error) {
	start := time.Now()
	cp, err := fn()
	s.metrics.opDur.WithLabelValues(op).Observe(time.Since(start).Seconds())
	code := "ok"
	if err != nil {
		if code = fault.CodeOf(err); code == "" {
			code = "internal"
		}
	}
	s.metrics.ops.WithLabelValues(op, code).Inc()
	return cp, err
}
