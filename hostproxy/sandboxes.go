package hostproxy

import (
	"context"
	"encoding/base32"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/net/netutil"

	"strata/egress"
	"strata/egress/policy"
	"strata/internal/api"
	"strata/internal/fault"
	"strata/internal/httpx"
	"strata/internal/jsend"
	"strata/sandbox"
	"strata/vmm"
)

// VMsConfig turns on microVM sandboxes: hostproxy creates, runs and
// deletes them through the API.
type VMsConfig struct {
	// Dir holds one directory per sandbox (disk, sockets, console log).
	// It and its parents must be traversable by others (mode o+x): QEMU
	// runs unprivileged below it.
	Dir string `json:"dir"`
	// Image is the guest image directory that strata-image build prints.
	Image string `json:"image"`
	// Accel is "tcg", "kvm", or empty to probe the host.
	Accel string `json:"accel,omitempty"`
	// BootTimeout bounds a boot to guestd answering (default 120s).
	BootTimeout Duration `json:"boot_timeout,omitempty"`
	// UIDBase is the first of this deployment's range of uids and gids
	// (sandbox.IDRangeSize of them); zero takes the range it already
	// claims, or the first free one from 200000. A range another
	// deployment on the host claims refuses the start, naming it.
	UIDBase uint32 `json:"uid_base,omitempty"`
	// IDClaims is the host-wide file of the deployments' id ranges
	// (default /var/lib/strata/ids.json): the same for every hostproxy
	// of the host.
	IDClaims string `json:"id_claims,omitempty"`
	// StoreReserveMiB is the free space kept on the store's filesystem
	// (default 1024): a snapshot, pause, fork or create that would cut
	// into it answers 507 insufficient_storage.
	StoreReserveMiB int64 `json:"store_reserve_mib,omitempty"`
	// SnapshotQuotaGiB caps the bytes of one sandbox's snapshots
	// (default 8 × its memory and disk): 409 snapshot_quota_exceeded.
	SnapshotQuotaGiB int64 `json:"snapshot_quota_gib,omitempty"`
	// MemoryReserveMiB is host memory kept free beyond the sandboxes'
	// (default 512); MemoryOvercommit the ratio of the sandboxes' memory
	// to the host's that admission allows (default 1: none).
	MemoryReserveMiB int     `json:"memory_reserve_mib,omitempty"`
	MemoryOvercommit float64 `json:"memory_overcommit,omitempty"`
	// DiskOvercommit is the ratio of what the disks of the sandboxes
	// with a QEMU may still grow by to the store's free space less its
	// reserve that a create, fork or start may reach (default 4; 1: the
	// store can never fill): 507 insufficient_storage.
	DiskOvercommit float64 `json:"disk_overcommit,omitempty"`
	// UnresponsiveLimit is how long a sandbox whose guest stopped
	// answering stays unresponsive before its QEMU is stopped and it is
	// put in error (default 3m).
	UnresponsiveLimit Duration `json:"unresponsive_limit,omitempty"`
	// Pool is how many sandboxes of the API's default resources (512 MiB,
	// 1 vCPU, 4 GiB) are kept booted ahead, of no account, so that a
	// create of those resources takes one instead of booting (default 0;
	// hostproxy's --vms flag: 1). Each counts in admission as a running
	// sandbox does.
	Pool int `json:"pool,omitempty"`
	// ForksAhead is for how many snapshots, the last forked on the host,
	// one fork is kept made ahead and stopped, so that the next fork of
	// such a snapshot takes it instead of starting a QEMU (default 0;
	// hostproxy's --vms flag: 1). Each counts in admission as a running
	// sandbox does, and is dropped when a create, fork, start, resume or
	// restore finds no room.
	ForksAhead int `json:"forks_ahead,omitempty"`
	// LazyTemplates makes a memory snapshot's template (the devices'
	// state its forks load) at its first fork instead of as soon as the
	// snapshot is taken: no template QEMU for snapshots never forked,
	// and a first fork slower by that QEMU's load (default false).
	LazyTemplates bool `json:"lazy_templates,omitempty"`
	// Egress is what every sandbox's network may reach (API.md,
	// "Network").
	Egress EgressConfig `json:"egress,omitzero"`
}

// EgressConfig is the deployment's part of every sandbox's network.
type EgressConfig struct {
	// Resolver is the DNS server the host asks for sandboxes' names,
	// "address" or "address:port" (default: the host's own, the first
	// nameserver of /etc/resolv.conf).
	Resolver string `json:"resolver,omitempty"`
	// AllowPrivate are CIDRs (or addresses) sandboxes may reach although
	// they are private, loopback, link-local or the host's own: the
	// deployment's own services, test hosts.
	AllowPrivate []string `json:"allow_private,omitempty"`
	// MaxConnections is the most TCP connections one sandbox has open
	// at a time (default 256), ConnectionsPerSecond the most it opens
	// per second (default 200), HostConnections the most all sandboxes
	// have open together (default 4096); BytesPerSecond bounds one
	// sandbox's bytes in and out together (default 0: no bound).
	MaxConnections       int `json:"max_connections,omitempty"`
	ConnectionsPerSecond int `json:"connections_per_second,omitempty"`
	HostConnections      int `json:"host_connections,omitempty"`
	BytesPerSecond       int `json:"bytes_per_second,omitempty"`
}

// DefaultHostConnections is vms.egress.host_connections' default.
const DefaultHostConnections = 4096

// hostAddrs are the addresses of the host's interfaces, each its own
// prefix.
func hostAddrs() ([]netip.Prefix, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("vms.egress: the host's addresses: %w", err)
	}
	var out []netip.Prefix
	for _, a := range addrs {
		if ipn, ok := a.(*net.IPNet); ok {
			if addr, ok := netip.AddrFromSlice(ipn.IP); ok {
				addr = addr.Unmap()
				out = append(out, netip.PrefixFrom(addr, addr.BitLen()))
			}
		}
	}
	return out, nil
}

// hostAddrsEvery is how often the host's addresses are read again for the
// sandboxes' networks (an interface that came up since).
const hostAddrsEvery = 30 * time.Second

// watchHostAddrs reads the host's addresses again every hostAddrsEvery
// and gives every sandbox's network the site with them, until ctx ends.
func watchHostAddrs(ctx context.Context, eg *egress.Config) {
	t := time.NewTicker(hostAddrsEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if addrs, err := hostAddrs(); err == nil {
			site := eg.Site
			site.HostAddrs = addrs
			eg.Shared.SetSite(site)
		}
	}
}

// egressConfig is c as package egress takes it, with the host's own
// addresses.
func egressConfig(c EgressConfig) (*egress.Config, error) {
	cfg := &egress.Config{MaxConns: c.MaxConnections, ConnsPerSecond: c.ConnectionsPerSecond, BytesPerSecond: c.BytesPerSecond}
	if c.MaxConnections < 0 || c.ConnectionsPerSecond < 0 || c.HostConnections < 0 || c.BytesPerSecond < 0 {
		return nil, errors.New("vms.egress: max_connections, connections_per_second, host_connections and bytes_per_second must be 0 or more")
	}
	host := c.HostConnections
	if host == 0 {
		host = DefaultHostConnections
	}
	cfg.Shared = egress.NewShared(host)
	for _, a := range c.AllowPrivate {
		p, err := netip.ParsePrefix(a)
		if err != nil {
			addr, aerr := netip.ParseAddr(a)
			if aerr != nil {
				return nil, fmt.Errorf("vms.egress.allow_private: %q is neither a CIDR nor an address", a)
			}
			p = netip.PrefixFrom(addr, addr.BitLen())
		}
		cfg.Site.AllowPrivate = append(cfg.Site.AllowPrivate, p.Masked())
	}
	var err error
	if cfg.Site.HostAddrs, err = hostAddrs(); err != nil {
		return nil, err
	}
	cfg.Shared.SetSite(cfg.Site)
	switch r := c.Resolver; {
	case r == "":
		if cfg.Resolver, err = egress.HostResolver(); err != nil {
			return nil, fmt.Errorf("vms.egress.resolver: none given, and the host's: %w", err)
		}
	default:
		if _, err := netip.ParseAddr(r); err == nil {
			r = net.JoinHostPort(r, "53")
		}
		if _, err := netip.ParseAddrPort(r); err != nil {
			return nil, fmt.Errorf("vms.egress.resolver: %q: want an address, or address:port", c.Resolver)
		}
		cfg.Resolver = r
	}
	return cfg, nil
}

var (
	errNoVMs         = fault.New(fault.Conflict, "sandboxes_disabled", "this host runs no microVM sandboxes (hostproxy has no vms configuration)")
	errBadPagination = "limit must be 1 to 500 and offset 0 or more, each given once; label=KEY=VALUE may be repeated; no other query parameters"
)

// openVMs starts the lifecycle manager and adopts the sandboxes an
// earlier hostproxy left running.
func (s *Server) openVMs(ctx context.Context, mc VMsConfig, publish func(*sandbox.Manager)) error {
	eg, err := egressConfig(mc.Egress)
	if err != nil {
		return err
	}
	eg.Refused, eg.Carried = s.metrics.egressRefused, s.metrics.egressCarried
	img, err := sandbox.LoadImage(mc.Image)
	if err != nil {
		return err
	}
	// The image cache keeps the images most recently built or used (by
	// their directory's mtime): this one is in use.
	now := time.Now()
	os.Chtimes(mc.Image, now, now)
	host, err := vmm.ReadHost()
	if err != nil {
		return err
	}
	probe, err := vmm.ProbeAccel(host, mc.Accel)
	if err != nil {
		return err
	}
	driver := &vmm.QEMU{Log: s.log}
	version, err := driver.Version(ctx)
	if err != nil {
		return err
	}
	// An older QEMU lacks what the sandboxes' confinement rests on
	// (read-only template RAM, frozen layers reopened read-only).
	if _, err := vmm.CheckVersion(version); err != nil {
		return err
	}
	m, err := sandbox.New(sandbox.Config{
		Egress:      eg,
		QEMUVersion: version,
		Dir:         mc.Dir, Image: img, Accel: probe, Records: s.reg, Log: s.log,
		Driver:            driver,
		BootTimeout:       time.Duration(mc.BootTimeout),
		UnresponsiveLimit: time.Duration(mc.UnresponsiveLimit),
		UIDBase:           mc.UIDBase, IDClaims: mc.IDClaims,
		StoreReserveBytes:  mc.StoreReserveMiB << 20,
		SnapshotQuotaBytes: mc.SnapshotQuotaGiB << 30,
		ReserveMiB:         mc.MemoryReserveMiB,
		Overcommit:         mc.MemoryOvercommit,
		DiskOvercommit:     mc.DiskOvercommit,
		Booted:             s.booted,
		ServeGuest:         s.serveGuest,
		Pool:               mc.Pool,
		ForksAhead:         mc.ForksAhead,
		LazyTemplates:      mc.LazyTemplates,
		PoolShape:          sandbox.Shape{MemoryMiB: api.DefaultMemoryMiB, VCPUs: api.DefaultVCPUs, DiskGiB: api.DefaultDiskGiB},
		NewID:              s.newSandboxID,
	})
	if err != nil {
		return err
	}
	s.machines = m
	publish(m)
	s.metrics.poolReady(func() float64 {
		ctx, cancel := context.WithTimeout(s.ctx, 5*time.Second)
		defer cancel()
		n, _ := m.PoolReady(ctx)
		return float64(n)
	})
	s.metrics.forksAheadReady(func() float64 { return float64(m.ForksAheadReady()) })
	s.log.Info("microVM sandboxes", "accel", probe.Accel, "why", probe.Reason, "image", img.Key, "dir", mc.Dir)
	if err := m.Recover(ctx); err != nil {
		m.Close()
		return fmt.Errorf("sandboxes: %w", err)
	}
	go watchHostAddrs(s.ctx, eg)
	return nil
}

func guestAddress(id string) string { return sandbox.GuestScheme + "://" + id }

type channelSandboxKey struct{}

// A guest is untrusted (root inside a sandbox controls it) and opens as
// many streams through its channel as it likes: each costs hostproxy a
// connection of its server for the guest's calls. These bound what one
// sandbox can hold: connections served at once (more wait in the
// channel's accept queue) and how long an idle one is kept.
const (
	maxGuestConns    = 32
	guestIdleTimeout = 10 * time.Second
)

// serveGuest serves the public API to processes inside sandbox id,
// through its channel: every call acts only on that sandbox, and the
// routes the authorization table marks outside (the account's, /metrics)
// are refused there (authz.go).
func (s *Server) serveGuest(id string, ln net.Listener) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r = r.WithContext(context.WithValue(r.Context(), channelSandboxKey{}, id))
		r.RemoteAddr = "sandbox-" + id + ":0"
		s.handler.ServeHTTP(w, r)
	})
	err := httpx.Serve(s.ctx, netutil.LimitListener(ln, maxGuestConns), h, httpx.ServeConfig{
		Log:               s.log,
		ReadHeaderTimeout: s.timeouts.readHeader,
		ReadTimeout:       s.timeouts.read,
		IdleTimeout:       guestIdleTimeout,
		ShutdownTimeout:   time.Second,
	})
	if err != nil {
		s.log.Debug("guest calls ended", "sandbox", id, "err", err)
	}
}

// channelSandbox is the sandbox whose channel a request came through, or
// "" for a request from the network.
func channelSandbox(ctx context.Context) string {
	id, _ := ctx.Value(channelSandboxKey{}).(string)
	return id
}

// sandboxView is a record as the API shows it: with its env (lists leave
// it out: listView).
func sandboxView(sb Sandbox) api.Sandbox {
	v := api.Sandbox{
		ID: sb.ID, Name: sb.Name, State: string(sb.State),
		MemoryMiB: sb.MemoryMiB, VCPUs: sb.VCPUs, DiskGiB: sb.DiskGiB,
		Error: sb.Error, Labels: sb.Labels, Env: sb.Env,
	}
	if v.Labels == nil {
		v.Labels = map[string]string{}
	}
	if e := sb.LastError; e != nil {
		v.LastError = &api.FailedOperation{Operation: e.Operation, Code: e.Code, Message: e.Message, At: api.FormatTime(e.At)}
	}
	if !sb.CreatedAt.IsZero() {
		v.CreatedAt = api.FormatTime(sb.CreatedAt)
	}
	if sb.State == sandbox.Unresponsive && !sb.UnresponsiveSince.IsZero() {
		v.UnresponsiveSince = api.FormatTime(sb.UnresponsiveSince)
		v.UnresponsiveReason = sb.UnresponsiveReason
	}
	if sb.From != nil {
		v.From = &api.SandboxFrom{Sandbox: sb.From.Sandbox, Snapshot: sb.From.Snapshot}
	}
	if sb.Machine != nil {
		a := accessOf(sb)
		v.Access = &a
		v.Network = &api.Network{Spec: networkOf(sb)}
	}
	return v
}

// networkOf is sandbox sb's network setting in its canonical form.
func networkOf(sb Sandbox) policy.Spec {
	if sb.Network == nil {
		return policy.Default().Spec()
	}
	return *sb.Network
}

// withUsage is v with its sandbox's network usage, while its machine
// runs.
func (s *Server) withUsage(v api.Sandbox) api.Sandbox {
	if v.Network == nil || s.machines == nil {
		return v
	}
	if u, ok := s.machines.NetworkUsage(v.ID); ok {
		n := *v.Network
		n.Usage = &api.NetworkUsage{BytesOut: u.BytesOut, BytesIn: u.BytesIn, Connections: u.Connections, Refused: u.Refused}
		v.Network = &n
	}
	return v
}

// lifecycleRoute checks a route on one microVM sandbox, after authorize:
// no query, no body, a microVM.
func (s *Server) lifecycleRoute(c echo.Context) (Sandbox, error) {
	sb := sandboxOf(c)
	if err := jsend.RejectQueryAndBody(c.Request()); err != nil {
		return sb, err
	}
	if s.machines == nil || sb.Machine == nil {
		return sb, sandbox.ErrNotAMachine
	}
	return sb, nil
}

func (s *Server) newSandboxID() (string, error) {
	var b [15]byte
	s.randMu.Lock()
	_, err := s.rand.Read(b[:])
	s.randMu.Unlock()
	if err != nil {
		return "", err
	}
	return api.SandboxIDPrefix + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b[:])), nil
}

// createSandbox is POST /v1/sandboxes: 202 with the record in creating.
func (s *Server) createSandbox(c echo.Context) error {
	p := principalOf(c)
	r := c.Request()
	if err := jsend.RejectQuery(r); err != nil {
		return err
	}
	key, err := api.IdempotencyKey(r.Header.Values(api.HeaderIdempotencyKey))
	if err != nil {
		return err
	}
	// Up to api.MaxCreateBody, not jsend.MaxBody: the largest env. A
	// create is never served through a channel (authz.go), so no guest
	// can make hostproxy hold such bodies in numbers.
	body, err := jsend.ReadBody(r, api.MaxCreateBody, api.ErrCreateBodyTooLarge)
	if err != nil {
		return err
	}
	// Every field is optional: no body at all is a create with every
	// default, as {} is. A body is validated whole.
	if len(body) == 0 {
		body = []byte("{}")
	}
	req, err := api.ParseSandboxCreate(body)
	if err != nil {
		return err
	}
	if s.machines == nil {
		return errNoVMs
	}
	var forkSrc, forkOf string // the sandbox's and the snapshot's ids, when from names them
	if req.From != nil {
		if forkSrc, forkOf, err = s.forkSource(r.Context(), p, *req.From); err != nil {
			return err
		}
	}
	id, err := s.newSandboxID()
	if err != nil {
		return err
	}
	rec := Sandbox{
		ID: id, Account: p.Account, Guest: guestAddress(id),
		CreatedAt: s.now().UTC().Truncate(time.Second),
		Access:    recordAccess(req.Access),
		Env:       req.Env, Labels: req.Labels,
		Network: req.Network,
	}
	if req.From != nil && req.Network == nil {
		// A fork keeps its source's network unless it gives its own:
		// a fork of a restricted sandbox is restricted too.
		src, err := s.reg.Sandbox(r.Context(), forkSrc)
		if err != nil {
			return err
		}
		rec.Network = src.Network
	}
	if req.From == nil {
		rec.MemoryMiB, rec.VCPUs, rec.DiskGiB = *req.MemoryMiB, *req.VCPUs, *req.DiskGiB
	}
	if req.Name != nil {
		rec.Name = *req.Name
	}
	// A retry with the same Idempotency-Key answers with the sandbox the
	// first request made, as it is now, and makes no other: the key is
	// claimed in the transaction that records the sandbox.
	ctx := withTaken(r.Context(), rec)
	var claim *createClaimReq
	if key != "" {
		claim = &createClaimReq{account: p.Account, key: key, request: requestHash(req), now: s.now()}
		ctx = withCreateClaim(ctx, claim)
	}
	if req.From != nil {
		rec, err = s.machines.Fork(ctx, forkSrc, forkOf, rec)
	} else {
		rec, err = s.machines.Create(ctx, rec)
	}
	if errors.Is(err, errClaimed) {
		sb, err := s.reg.Sandbox(r.Context(), claim.prior)
		switch {
		case fault.CodeOf(err) == "sandbox_not_found":
			// Made by the first request, and deleted since.
			return accepted(c, api.Sandbox{ID: claim.prior, State: string(sandbox.Destroyed)})
		case err != nil:
			return err
		}
		return accepted(c, sandboxView(sb))
	}
	if err != nil {
		return err
	}
	s.handedOver(rec)
	return accepted(c, sandboxView(rec))
}

// forkSource is the sandbox and the snapshot, by their ids, that a
// create's from names: a snapshot by its ref alone (from.sandbox, when
// given too, must name the snapshot's sandbox), or a sandbox by its id or
// name and one of its snapshots by its id, name or ref. A sandbox of
// another account is as unknown as one that does not exist
// (sandbox_not_found), and so is a snapshot of one (snapshot_not_found).
func (s *Server) forkSource(ctx context.Context, p Principal, from api.SandboxFrom) (src, snap string, err error) {
	notFound := sandbox.ErrSnapshotNotFound.With("snapshot_id", from.Snapshot)
	var named Sandbox
	if from.Sandbox != "" {
		sb, found, err := s.reg.resolveSandbox(ctx, p.Account, from.Sandbox)
		if err != nil {
			return "", "", err
		}
		if !found {
			return "", "", errSandboxNotFound
		}
		named = sb
	}
	if api.ValidSnapshotRef(from.Snapshot) {
		e, found, err := s.reg.snapshotByRef(ctx, from.Snapshot)
		if err != nil {
			return "", "", err
		}
		if !found || from.Sandbox != "" && e.Sandbox != named.ID {
			return "", "", notFound
		}
		sb, found, err := s.reg.resolveSandbox(ctx, p.Account, e.Sandbox)
		if err != nil {
			return "", "", err
		}
		if !found || sb.ID != e.Sandbox {
			return "", "", notFound
		}
		return e.Sandbox, e.Snapshot, nil
	}
	sn, ok := findSnapshot(named, from.Snapshot)
	if !ok {
		return "", "", notFound
	}
	return named.ID, sn.ID, nil
}

// handedOver follows a create or a fork answered with a sandbox already
// running (taken from the pool or from the forks made ahead): its guest
// was handed its credentials at its boot, before it had an account and
// an access setting, so they are put again, in the background (the key
// it holds is refused per call meanwhile if its setting is none).
func (s *Server) handedOver(rec Sandbox) {
	if rec.State != StateRunning {
		return
	}
	s.owed.touch(guestAddress(rec.ID))
	s.deliverOwed(rec)
}

// accepted answers 202 with data and the poll interval.
func accepted(c echo.Context, data any) error {
	c.Response().Header().Set("X-Poll-After", "1")
	c.Response().Header().Set("Content-Type", "application/json")
	c.Response().WriteHeader(http.StatusAccepted)
	return json.NewEncoder(c.Response()).Encode(map[string]any{"status": "success", "data": data})
}

// listSandboxes is GET /v1/sandboxes: the account's sandboxes, oldest
// first, those with every label= given, paginated with limit and offset.
// Records are listed without their env (api.Sandbox.Env).
func (s *Server) listSandboxes(c echo.Context) (any, error) {
	p := principalOf(c)
	if err := jsend.RejectBody(c.Request()); err != nil {
		return nil, err
	}
	limit, offset, sel, err := listQuery(c.Request())
	if err != nil {
		return nil, err
	}
	all, err := s.reg.List(c.Request().Context())
	if err != nil {
		return nil, err
	}
	mine := []api.Sandbox{}
	for _, sb := range all {
		if sb.Account == p.Account && sel.Matches(sb.Labels) {
			v := sandboxView(sb)
			v.Env = nil
			if v.Network != nil {
				// Its mode alone: a page of 500 records with two lists
				// of 256 rules each would be 130 MB.
				v.Network = &api.Network{Spec: policy.Spec{Egress: v.Network.Egress}}
			}
			mine = append(mine, v)
		}
	}
	total := len(mine)
	page := mine[min(offset, total):min(offset+limit, total)]
	return api.SandboxList{Data: page, Pagination: api.Pagination{Total: total, Limit: limit, Offset: offset, Count: len(page)}}, nil
}

// listQuery reads a list's query: ?limit= (1–500, default 50) and
// ?offset= (≥ 0), each at most once, and ?label=key=value, repeatable
// (api.ParseLabelSelector); any other parameter is invalid_field, and so
// is a query that is not one.
func listQuery(r *http.Request) (limit, offset int, sel api.LabelSelector, err error) {
	limit = 50
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil {
		return 0, 0, nil, jsend.InvalidField("query", "the query string is malformed")
	}
	for k, v := range q {
		if k == "label" {
			if sel, err = api.ParseLabelSelector(v); err != nil {
				return 0, 0, nil, err
			}
			continue
		}
		if len(v) != 1 {
			return 0, 0, nil, jsend.InvalidField(k, errBadPagination)
		}
		n, err := strconv.Atoi(v[0])
		switch {
		case k == "limit" && err == nil && n >= 1 && n <= 500:
			limit = n
		case k == "offset" && err == nil && n >= 0 && n <= 1<<30:
			offset = n
		default:
			return 0, 0, nil, jsend.InvalidField(k, errBadPagination)
		}
	}
	return limit, offset, sel, nil
}

// maxWaitS bounds wait_s: a waiting read holds a request and a goroutine,
// no more, and stays well inside the server's write timeout.
const maxWaitS = 30

// waitPoll is how often a waiting read looks at the record again.
const waitPoll = 20 * time.Millisecond

var errBadWait = fmt.Sprintf("want a whole number of seconds from 1 to %d, and no other query parameter", maxWaitS)

// getSandbox is GET /v1/sandboxes/{id}. With ?wait_s=N a sandbox in a
// state on its way to another (creating, pausing, …) is answered once it
// has left it, or after N seconds as it is then: a client waiting for an
// operation learns the end at once instead of at its next poll.
func (s *Server) getSandbox(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	wait, err := waitQuery(r)
	if err != nil {
		return nil, err
	}
	if err := jsend.RejectBody(r); err != nil {
		return nil, err
	}
	if s.timeouts.write > 0 {
		wait = min(wait, s.timeouts.write/2)
	}
	if wait > 0 && api.SandboxTransient(string(sb.State)) {
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		t := time.NewTicker(waitPoll)
		defer t.Stop()
		for api.SandboxTransient(string(sb.State)) {
			select {
			case <-ctx.Done():
				if r.Context().Err() != nil {
					return nil, r.Context().Err()
				}
				return s.withUsage(sandboxView(sb)), nil
			case <-t.C:
			}
			if sb, err = s.reg.Sandbox(r.Context(), sb.ID); err != nil {
				return nil, err
			}
		}
	}
	return s.withUsage(sandboxView(sb)), nil
}

// waitQuery reads GET /v1/sandboxes/{id}'s one query parameter, wait_s
// (0 when there is none).
func waitQuery(r *http.Request) (time.Duration, error) {
	if r.URL.RawQuery == "" && !r.URL.ForceQuery {
		return 0, nil
	}
	q, err := url.ParseQuery(r.URL.RawQuery)
	if err != nil || len(q) != 1 || len(q["wait_s"]) != 1 {
		return 0, jsend.InvalidField("wait_s", errBadWait)
	}
	n, err := strconv.Atoi(q["wait_s"][0])
	if err != nil || n < 1 || n > maxWaitS {
		return 0, jsend.InvalidField("wait_s", errBadWait)
	}
	return time.Duration(n) * time.Second, nil
}

func (s *Server) deleteSandbox(c echo.Context) (any, error) {
	sb, err := s.lifecycleRoute(c)
	if err != nil {
		return nil, err
	}
	s.endAttachments(sb.ID, "the sandbox is being deleted")
	// The record already says destroying: a client that hangs up must not
	// leave the deletion half-done.
	if err := s.machines.Delete(context.WithoutCancel(c.Request().Context()), sb.ID); err != nil {
		return nil, err
	}
	s.guests.Forget(sb.Guest)
	s.owed.forget(guestAddress(sb.ID))
	return map[string]string{"id": sb.ID, "state": string(sandbox.Destroyed)}, nil
}

// lifecycle is a pause, resume or start: 202 with the transitional state,
// 200 when the sandbox is already where the operation leads.
func (s *Server) lifecycle(op func(context.Context, string) (Sandbox, error), final sandbox.State) echo.HandlerFunc {
	return func(c echo.Context) error {
		sb, err := s.lifecycleRoute(c)
		if err != nil {
			return err
		}
		rec, err := op(c.Request().Context(), sb.ID)
		if err != nil {
			return err
		}
		data := map[string]string{"id": rec.ID, "state": string(rec.State)}
		if rec.State == final {
			jsend.Success(c.Response(), data)
			return nil
		}
		return accepted(c, data)
	}
}

func (s *Server) stopSandbox(c echo.Context) (any, error) {
	sb, err := s.lifecycleRoute(c)
	if err != nil {
		return nil, err
	}
	s.endAttachments(sb.ID, "the sandbox is stopping")
	rec, err := s.machines.Stop(c.Request().Context(), sb.ID)
	if err != nil {
		return nil, err
	}
	s.guests.Forget(sb.Guest)
	return map[string]string{"id": rec.ID, "state": string(rec.State)}, nil
}

// execInSandbox is POST /v1/sandboxes/{id}/exec: the body is checked here
// as guestd checks it, the sandbox's env is put under the call's own
// (api.WithSandboxEnv), and the call may last the command's timeout.
func (s *Server) execInSandbox(c echo.Context) (any, error) {
	sb := sandboxOf(c)
	r := c.Request()
	release, err := s.holdBody(c, api.MaxExecBody)
	if err != nil {
		return nil, err
	}
	defer release()
	req, body, err := api.ReadExec(r)
	if err != nil {
		return nil, err
	}
	// The sandbox's env, under the call's own: guestd sees one env.
	if body, err = api.WithSandboxEnv(body, sb.Env, req.Env); err != nil {
		return nil, err
	}
	if sb.State != StateRunning {
		return nil, errSandboxNotRunning.With("state", string(sb.State))
	}
	timeout := time.Duration(req.TimeoutS)*time.Second + 30*time.Second
	http.NewResponseController(c.Response().Writer).SetWriteDeadline(time.Now().Add(timeout + 10*time.Second))
	return s.guestCall(c, "exec", func() (*GuestData, error) {
		return s.guests.Exec(r.Context(), sb.Guest, body, timeout)
	})
}

func (s *Server) pauseSandbox(ctx context.Context, id string) (Sandbox, error) {
	s.endAttachments(id, "the sandbox is pausing")
	return s.machines.Pause(ctx, id)
}

func (s *Server) resumeSandbox(ctx context.Context, id string) (Sandbox, error) {
	// A pause ended its QEMU: the pooled connections to the guest are
	// the old machine's, as after a stop or a restore.
	s.guests.Forget(guestAddress(id))
	return s.machines.Resume(ctx, id)
}

func (s *Server) startSandbox(ctx context.Context, id string) (Sandbox, error) {
	return s.machines.Start(ctx, id)
}
