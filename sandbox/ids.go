package sandbox

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Identities: every QEMU runs as a uid and gid of its own, and every
// template's RAM file has a group of its own that only its forks' QEMUs
// get. Two deployments on one host (two hostproxys with different state
// directories) must never hand out the same ones: the second's QEMU could
// open the first's sockets and template RAM. So each deployment claims a
// range of ids host-wide before it starts, in one file (IDClaims, by
// default /var/lib/strata/ids.json, not under any deployment's state)
// changed only under a lock beside it. A claim is keyed by the
// deployment's Dir and carries a token that the Dir holds too (<Dir>/.ids):
// a claim whose Dir is gone, or holds another token, is no deployment's
// any more and is reclaimed. Ranges that overlap the host's own users and
// groups (/etc/passwd, /etc/group) or its subordinate ids (/etc/subuid,
// /etc/subgid) are never chosen. A Dir is run by one Manager at a time:
// <Dir>/.lock is held (flock) from New to Close.

// IDRange is a deployment's share of the host's ids: its sandboxes' uids
// (each QEMU's gid is its uid) are Base … Base+Size/2−1, its templates'
// groups Base+Size/2 … Base+Size−1.
type IDRange struct {
	Base uint32 `json:"base"`
	Size uint32 `json:"size"`
}

// The default ranges: 100,000 sandboxes and 100,000 templates each,
// counted from 200000 (where they always began), below 2^31.
const (
	DefaultUIDBase   = 200000
	IDRangeSize      = 200000
	maxID            = 1 << 31
	DefaultIDClaims  = "/var/lib/strata/ids.json"
	deploymentMarker = ".ids"
	dirLockName      = ".lock"
)

// UIDs is the first uid and one past the last.
func (r IDRange) UIDs() (uint32, uint32) { return r.Base, r.Base + r.Size/2 }

// GIDs is the first template group and one past the last.
func (r IDRange) GIDs() (uint32, uint32) { return r.Base + r.Size/2, r.Base + r.Size }

func (r IDRange) end() uint64 { return uint64(r.Base) + uint64(r.Size) }

func (r IDRange) overlaps(first, end uint64) bool {
	return uint64(r.Base) < end && first < r.end()
}

func (r IDRange) String() string { return fmt.Sprintf("%d-%d", r.Base, r.end()-1) }

// idClaim is one deployment's claim in the host's claims file.
type idClaim struct {
	Dir   string    `json:"dir"`
	Range IDRange   `json:"range"`
	Token string    `json:"token"`
	At    time.Time `json:"at"`
}

type idClaims struct {
	Claims []idClaim `json:"claims"`
}

// idSpan is ids the host itself uses: [First, End), and where they are.
type idSpan struct {
	First, End uint64
	What       string
}

// chooseRange is the range of the deployment at dir. claims are the
// other deployments' live claims and its own (if any); want is a
// configured base (0: any); held are ids its records already hold, which
// the range must contain; system are the host's own ids. Its own claim
// stands unless want differs; otherwise want, or the first free range
// from DefaultUIDBase up. A range is free when it overlaps no other claim
// and no system id.
func chooseRange(claims []idClaim, dir string, want uint32, held []uint32, system []idSpan) (IDRange, error) {
	var others []idClaim
	for _, c := range claims {
		if c.Dir == dir {
			if want != 0 && c.Range.Base != want {
				return IDRange{}, fmt.Errorf("the deployment at %s holds ids %s; the configured uid_base %d differs (its sandboxes keep the ids they have: configure %d, or none)", dir, c.Range, want, c.Range.Base)
			}
			return c.Range, nil
		}
		others = append(others, c)
	}
	check := func(r IDRange) error {
		if r.end() > maxID {
			return fmt.Errorf("ids %d and up: past %d", r.Base, maxID-1)
		}
		for _, c := range others {
			if r.overlaps(uint64(c.Range.Base), c.Range.end()) {
				return fmt.Errorf("ids %s overlap %s, which the deployment at %s holds (since %s)", r, c.Range, c.Dir, c.At.Format(time.RFC3339))
			}
		}
		for _, s := range system {
			if r.overlaps(s.First, s.End) {
				return fmt.Errorf("ids %s overlap the host's %s (%d-%d)", r, s.What, s.First, s.End-1)
			}
		}
		for _, id := range held {
			if id < r.Base || uint64(id) >= r.end() {
				return fmt.Errorf("this deployment's records hold id %d, outside %s", id, r)
			}
		}
		return nil
	}
	if want != 0 {
		r := IDRange{Base: want, Size: IDRangeSize}
		if err := check(r); err != nil {
			return IDRange{}, fmt.Errorf("uid_base %d cannot be used: %w", want, err)
		}
		return r, nil
	}
	var first error
	for base := uint64(DefaultUIDBase); base+IDRangeSize <= maxID; base += IDRangeSize {
		r := IDRange{Base: uint32(base), Size: IDRangeSize}
		err := check(r)
		if err == nil {
			return r, nil
		}
		if first == nil {
			first = err
		}
	}
	return IDRange{}, fmt.Errorf("no range of %d ids is free on this host (the first: %w)", IDRangeSize, first)
}

// parseIDFile reads the ids a host file gives out: the third field of
// /etc/passwd and /etc/group lines (one id each), or the second and third
// of /etc/subuid and /etc/subgid lines (a start and a count). Lines it
// cannot read are skipped: a wrong guess only skips more ranges.
func parseIDFile(name string, b []byte, sub bool) []idSpan {
	var out []idSpan
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		f := strings.Split(line, ":")
		if sub {
			if len(f) < 3 {
				continue
			}
			start, err1 := strconv.ParseUint(f[1], 10, 32)
			count, err2 := strconv.ParseUint(f[2], 10, 32)
			if err1 != nil || err2 != nil || count == 0 {
				continue
			}
			out = append(out, idSpan{First: start, End: start + count, What: fmt.Sprintf("%s entry of %s", name, f[0])})
			continue
		}
		if len(f) < 3 {
			continue
		}
		id, err := strconv.ParseUint(f[2], 10, 32)
		if err != nil {
			continue
		}
		out = append(out, idSpan{First: id, End: id + 1, What: fmt.Sprintf("%s entry of %s", name, f[0])})
	}
	return out
}

// systemIDs are the ids the host's files under etc give out.
func systemIDs(etc string) []idSpan {
	var out []idSpan
	for _, f := range []struct {
		name string
		sub  bool
	}{{"passwd", false}, {"group", false}, {"subuid", true}, {"subgid", true}} {
		b, err := os.ReadFile(filepath.Join(etc, f.name))
		if err != nil {
			continue
		}
		out = append(out, parseIDFile("/etc/"+f.name, b, f.sub)...)
	}
	return out
}

// lockDir takes <dir>/.lock for the Manager's life: a second Manager on
// the same directory (another hostproxy on the same state) is refused.
func lockDir(dir string) (*os.File, error) {
	path := filepath.Join(dir, dirLockName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, fmt.Errorf("sandbox: another hostproxy runs the sandboxes of %s (it holds %s); stop it first", dir, path)
		}
		return nil, fmt.Errorf("sandbox: lock %s: %w", path, err)
	}
	return f, nil
}

// claimIDs takes the deployment at dir its range of ids in the host's
// claims file (path), under the lock beside it: stale claims are dropped,
// the range is chosen (chooseRange), and the claim is written, then the
// token in <dir>/.ids.
func claimIDs(path, dir string, want uint32, held []uint32, etc string) (IDRange, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	}
	lf, err := os.OpenFile(path+".lock", os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	}
	defer lf.Close()
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: lock %s.lock: %w", path, err)
	}
	var all idClaims
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	default:
		if err := json.Unmarshal(b, &all); err != nil {
			return IDRange{}, fmt.Errorf("sandbox: ids: %s: %w (the host's claims of uid and gid ranges; fix or remove it once no hostproxy runs)", path, err)
		}
	}
	var live []idClaim
	for _, c := range all.Claims {
		if c.Dir == dir || claimLive(c) {
			live = append(live, c)
		}
	}
	r, err := chooseRange(live, dir, want, held, systemIDs(etc))
	if err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	}
	i := slices.IndexFunc(live, func(c idClaim) bool { return c.Dir == dir })
	if i < 0 {
		live = append(live, idClaim{Dir: dir, Range: r, Token: newToken(), At: time.Now().UTC()})
		i = len(live) - 1
	}
	// The token in the Dir first: a claim written with no token beside
	// it would be reclaimed by the next deployment that looks.
	if err := writeFileSync(filepath.Join(dir, deploymentMarker), []byte(live[i].Token+"\n"), 0o600); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	}
	out, err := json.MarshalIndent(idClaims{Claims: live}, "", "  ")
	if err != nil {
		return IDRange{}, err
	}
	if err := writeFileSync(path, append(out, '\n'), 0o644); err != nil {
		return IDRange{}, fmt.Errorf("sandbox: ids: %w", err)
	}
	return r, nil
}

// claimLive tells whether a claim's deployment is still there: its Dir
// holds its token.
func claimLive(c idClaim) bool {
	b, err := os.ReadFile(filepath.Join(c.Dir, deploymentMarker))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ENOTDIR) {
		return false
	}
	if err != nil {
		return true // unreadable is not gone
	}
	return strings.TrimSpace(string(b)) == c.Token
}

func newToken() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// writeFileSync replaces path with b: a temporary file synced, renamed
// over it, and the directory synced.
func writeFileSync(path string, b []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|unix.O_CLOEXEC|unix.O_NOFOLLOW, mode)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(path))
}

// heldIDs are the uids and template groups records hold.
func heldIDs(records []Record) []uint32 {
	var out []uint32
	for _, r := range records {
		if r.Machine != nil {
			out = append(out, r.Machine.Uid)
			if r.Machine.RAMGid != 0 {
				out = append(out, r.Machine.RAMGid)
			}
			if t := r.Machine.SavedTemplate; t != nil {
				out = append(out, t.Gid)
			}
		}
		for _, s := range r.Snapshots {
			if s.Template != nil {
				out = append(out, s.Template.Gid)
			}
		}
	}
	return out
}
