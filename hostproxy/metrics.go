package hostproxy

import (
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"strata/egress/policy"
)

// metrics are the server's Prometheus series. Labels are route templates,
// methods and statuses only: never a sandbox id, a key or a path, so the
// number of series stays fixed.
type metrics struct {
	registry *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	inFlight prometheus.Gauge
	guest    *prometheus.HistogramVec
	refused  *prometheus.CounterVec
	carried  *prometheus.CounterVec
}

// egressRefused counts a connection or DNS question a sandbox's network
// refused, by its reason (a fixed set: policy.Reasons and egress's own).
func (m *metrics) egressRefused(r policy.Reason) { m.refused.WithLabelValues(string(r)).Inc() }

// egressCarried counts bytes through sandboxes' networks.
func (m *metrics) egressCarried(out bool, n int) {
	dir := "in"
	if out {
		dir = "out"
	}
	m.carried.WithLabelValues(dir).Add(float64(n))
}

// poolReady registers strata_hostproxy_pool_ready: the pooled sandboxes
// running, ready for a create to take (0 without microVM sandboxes).
func (m *metrics) poolReady(count func() float64) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "strata", Subsystem: "hostproxy", Name: "pool_ready",
		Help: "Pooled sandboxes running, ready for a create of the default resources to take (vms.pool).",
	}, count))
}

// forksAheadReady registers strata_hostproxy_forks_ahead_ready: the
// forks made ahead, stopped and ready for a fork of their snapshot to
// take.
func (m *metrics) forksAheadReady(count func() float64) {
	m.registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: "strata", Subsystem: "hostproxy", Name: "forks_ahead_ready",
		Help: "Forks made ahead, stopped, ready for the next fork of their snapshot to take (vms.forks_ahead).",
	}, count))
}

func newMetrics() *metrics {
	m := &metrics{
		registry: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "strata", Subsystem: "hostproxy", Name: "requests_total",
			Help: "API requests by route template, method and HTTP status.",
		}, []string{"route", "method", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "strata", Subsystem: "hostproxy", Name: "request_duration_seconds",
			Help:    "API request latency by route template, method and HTTP status.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"route", "method", "status"}),
		inFlight: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "strata", Subsystem: "hostproxy", Name: "requests_in_flight",
			Help: "API requests being served.",
		}),
		guest: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "strata", Subsystem: "hostproxy", Name: "guest_request_duration_seconds",
			Help:    "Calls to guest daemons by operation and outcome (ok, fail, error).",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"operation", "outcome"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "strata", Subsystem: "egress", Name: "refused_total",
			Help: "Connections and DNS questions sandboxes' networks refused, by reason.",
		}, []string{"reason"}),
		carried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "strata", Subsystem: "egress", Name: "bytes_total",
			Help: "Bytes carried through sandboxes' networks: out (from the guests) and in.",
		}, []string{"direction"}),
	}
	m.registry.MustRegister(m.requests, m.duration, m.inFlight, m.guest, m.refused, m.carried,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

func (m *metrics) observe(route, method string, status int, d time.Duration) {
	s := strconv.Itoa(status)
	method = metricMethod(method)
	m.requests.WithLabelValues(route, method, s).Inc()
	m.duration.WithLabelValues(route, method, s).Observe(d.Seconds())
}

// metricMethod bounds the method label: net/http accepts any token as a
// method, so a client could otherwise create series without end.
func metricMethod(m string) string {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut,
		http.MethodPatch, http.MethodDelete, http.MethodOptions:
		return m
	}
	return "OTHER"
}

// handler serves the metrics. They tell of every account's and every
// sandbox's activity: the authorization table (authz.go) gives them to an
// account key only, and never through a sandbox's channel.
func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{})
}
