package api

import (
	"encoding/json"
	"fmt"
	"strings"

	"strata/egress/policy"
	"strata/internal/fault"
	"strata/internal/jsend"
)

// Resources of a new sandbox: the range of each and its default.
const (
	MinMemoryMiB, MaxMemoryMiB, DefaultMemoryMiB = 128, 8192, 512
	MinVCPUs, MaxVCPUs, DefaultVCPUs             = 1, 4, 1
	MinDiskGiB, MaxDiskGiB, DefaultDiskGiB       = 1, 64, 4
)

// MaxSandboxName is the longest sandbox name, in characters (all ASCII).
const MaxSandboxName = 63

// SandboxIDPrefix starts every sandbox id the API makes.
const SandboxIDPrefix = "sb-"

// States of a sandbox, as the record's state names them.
const (
	SandboxCreating = "creating"
	SandboxRunning  = "running"
	// SandboxUnresponsive is a running sandbox whose guest stopped
	// answering: it is running again once the guest answers, or error.
	SandboxUnresponsive = "unresponsive"
	SandboxPausing      = "pausing"
	SandboxPaused       = "paused"
	SandboxResuming     = "resuming"
	SandboxStopping     = "stopping"
	SandboxStopped      = "stopped"
	SandboxError        = "error"
	SandboxDestroying   = "destroying"
	SandboxDestroyed    = "destroyed"
)

// SandboxTransient reports whether state is one a sandbox passes through
// on its way to another (creating, unresponsive, pausing, resuming,
// stopping, destroying): a client waiting for an operation to finish
// polls on.
func SandboxTransient(state string) bool {
	switch state {
	case SandboxCreating, SandboxUnresponsive, SandboxPausing, SandboxResuming, SandboxStopping, SandboxDestroying:
		return true
	}
	return false
}

// Sandbox is a sandbox record as the API shows it. Error is a sentence,
// set in state error; From names the snapshot a fork was made from.
type Sandbox struct {
	ID        string `json:"id"`
	Name      string `json:"name"`
	State     string `json:"state"`
	MemoryMiB int    `json:"memory_mib"`
	VCPUs     int    `json:"vcpus"`
	DiskGiB   int    `json:"disk_gib"`
	CreatedAt string `json:"created_at"`
	Error     string `json:"error,omitempty"`
	// UnresponsiveSince is when the guest stopped answering, in state
	// unresponsive (RFC 3339).
	UnresponsiveSince string `json:"unresponsive_since,omitempty"`
	// UnresponsiveReason says why, when the host knows.
	UnresponsiveReason string       `json:"unresponsive_reason,omitempty"`
	From               *SandboxFrom `json:"from,omitempty"`
	// Labels are the sandbox's labels ({} when it has none).
	Labels map[string]string `json:"labels"`
	// Env is the environment every exec and session of the sandbox
	// starts with, under the call's own: shown by a create and a read of
	// the one sandbox when it has any, never in lists (64 entries of
	// 4 KiB each would make a page of 500 records 128 MiB).
	Env map[string]string `json:"env,omitempty"`
	// LastError is an operation answered 202 that then failed (a pause
	// whose memory could not be saved: the sandbox runs on).
	LastError *FailedOperation `json:"last_error,omitempty"`
	// Access is a microVM sandbox's access setting: what the key its
	// guest is handed (its channel key) may do. A configured sandbox
	// has none (it has no channel).
	Access *Access `json:"access,omitempty"`
	// Network is a microVM sandbox's network setting, with its usage
	// while it runs.
	Network *Network `json:"network,omitempty"`
}

// Network is a sandbox's network setting (API.md, "Network"), as GET and
// PUT …/network and the record show it: the setting in its canonical
// form, and the traffic since its machine last started.
type Network struct {
	policy.Spec
	Usage *NetworkUsage `json:"usage,omitempty"`
}

// NetworkUsage is a sandbox's traffic since its machine last started:
// bytes out (from the guest) and in, TCP connections carried, and the
// connections and DNS questions refused.
type NetworkUsage struct {
	BytesOut    uint64 `json:"bytes_out"`
	BytesIn     uint64 `json:"bytes_in"`
	Connections uint64 `json:"connections"`
	Refused     uint64 `json:"refused"`
}

// MaxNetworkBody bounds the body of PUT …/network: two lists of
// policy.MaxRules rules of policy.MaxName bytes, every byte escaped
// (six), with their quotes and commas.
const MaxNetworkBody = 1 << 20

// ErrNetworkBodyTooLarge is body_too_large for a network body over
// MaxNetworkBody.
var ErrNetworkBodyTooLarge = fault.New(fault.TooLarge, "body_too_large", "the request body is larger than 1 MiB").With("limit", MaxNetworkBody)

// ParseNetworkBody decodes and checks the body of PUT …/network (a
// network setting: policy.Parse) and returns it in its canonical form.
func ParseNetworkBody(body []byte) (policy.Spec, error) {
	if len(body) > MaxNetworkBody {
		return policy.Spec{}, ErrNetworkBodyTooLarge
	}
	var s policy.Spec
	if err := jsend.DecodeBytes(body, &s); err != nil {
		return policy.Spec{}, err
	}
	p, err := policy.Parse(s)
	if err != nil {
		return policy.Spec{}, err
	}
	return p.Spec(), nil
}

// FailedOperation is an operation on a sandbox that failed after it was
// answered.
type FailedOperation struct {
	Operation string `json:"operation"`
	Code      string `json:"code,omitempty"`
	Message   string `json:"message"`
	At        string `json:"at"`
}

// SandboxList is the data of GET /v1/sandboxes: one page of records,
// paginated the CreateOS way.
type SandboxList struct {
	Data       []Sandbox  `json:"data"`
	Pagination Pagination `json:"pagination"`
}

// Pagination describes one page: Total records in all, the Limit and
// Offset asked for, and Count on this page.
type Pagination struct {
	Total  int `json:"total"`
	Limit  int `json:"limit"`
	Offset int `json:"offset"`
	Count  int `json:"count"`
}

// SandboxFrom names the snapshot a fork is made from: a snapshot (its id,
// name or ref) of a sandbox (its id or name); with a ref, the sandbox may
// be left out (a ref names one snapshot on the whole deployment).
type SandboxFrom struct {
	Sandbox  string `json:"sandbox,omitempty"`
	Snapshot string `json:"snapshot"`
}

// SandboxCreateRequest is the body of POST /v1/sandboxes: a new sandbox
// with the given resources, or, with From, a fork of a snapshot, which
// takes its resources from the snapshot.
type SandboxCreateRequest struct {
	Name      *string      `json:"name,omitempty"`
	MemoryMiB *int         `json:"memory_mib,omitempty"`
	VCPUs     *int         `json:"vcpus,omitempty"`
	DiskGiB   *int         `json:"disk_gib,omitempty"`
	From      *SandboxFrom `json:"from,omitempty"`
	// Access is the sandbox's access setting (ParseAccess): what its
	// guest's channel key may do; left out, DefaultAccess. A fork takes
	// its own, never its source's.
	Access json.RawMessage `json:"access,omitempty"`
	// Env is the environment of every exec and session of the sandbox
	// (ValidateSandboxEnv); Labels its labels (ValidateLabels). A fork
	// takes its own, never its source's.
	Env    map[string]string `json:"env,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	// Network is the sandbox's network setting (policy.Parse), left out
	// for the default (all) or, for a fork, its source's.
	Network *policy.Spec `json:"network,omitempty"`
}

// SetAccess sets the request's access setting.
func (req *SandboxCreateRequest) SetAccess(a Access) {
	req.Access, _ = json.Marshal(a)
}

// ParseSandboxCreate decodes the body of POST /v1/sandboxes (at most
// MaxCreateBody, exactly one JSON object, no unknown fields: the errors of
// jsend.DecodeBytes) and validates it (Validate).
func ParseSandboxCreate(body []byte) (SandboxCreateRequest, error) {
	if len(body) > MaxCreateBody {
		return SandboxCreateRequest{}, ErrCreateBodyTooLarge
	}
	var req SandboxCreateRequest
	if err := jsend.DecodeBytes(body, &req); err != nil {
		return SandboxCreateRequest{}, err
	}
	return req.Validate()
}

// Validate checks a decoded create request and returns it with its
// defaults filled in:
//
//   - name, optional, follows ValidateSandboxName;
//   - memory_mib is 128 to 8192 (default 512), vcpus 1 to 4 (default 1),
//     disk_gib 1 to 64 (default 4);
//   - access, optional, is "none" or {"scopes":[…]} (ParseAccess); it is
//     rewritten in its canonical form, and left out when it is the
//     default, so that equal settings make equal requests;
//   - env, optional, follows ValidateSandboxEnv; labels, optional,
//     ValidateLabels; an empty one is left out;
//   - from, optional, is {"sandbox","snapshot"}: a snapshot's id
//     (ValidSnapshotID), name (ValidSnapshotName) or ref
//     (ValidSnapshotRef), of a sandbox named by its id or name
//     (ValidSandboxID: the shape both have), which may be left out when
//     the snapshot is given by its ref. A fork takes its resources from
//     the snapshot, so memory_mib, vcpus or disk_gib beside from is
//     invalid_field naming the first given.
//
// A null field is a field left out. For a new sandbox MemoryMiB, VCPUs
// and DiskGiB come back never nil; for a fork they stay nil. Each broken
// rule is invalid_field naming the field ("name", "memory_mib", "vcpus",
// "disk_gib", "access", "access.scopes", "env", "labels", "from.sandbox",
// "from.snapshot").
func (req SandboxCreateRequest) Validate() (SandboxCreateRequest, error) {
	if req.Name != nil {
		if err := ValidateSandboxName(*req.Name); err != nil {
			return SandboxCreateRequest{}, err
		}
	}
	if err := ValidateSandboxEnv("env", req.Env); err != nil {
		return SandboxCreateRequest{}, err
	}
	if err := ValidateLabels("labels", req.Labels); err != nil {
		return SandboxCreateRequest{}, err
	}
	if len(req.Env) == 0 {
		req.Env = nil
	}
	if len(req.Labels) == 0 {
		req.Labels = nil
	}
	access, err := ParseAccess("access", req.Access)
	if err != nil {
		return SandboxCreateRequest{}, err
	}
	if req.Network != nil {
		p, err := policy.Parse(*req.Network)
		if err != nil {
			return SandboxCreateRequest{}, err
		}
		spec := p.Spec()
		req.Network = &spec
	}
	req.Access = nil
	if access.String() != DefaultAccess().String() {
		req.Access, _ = json.Marshal(access)
	}
	resources := []struct {
		field         string
		v             **int
		min, max, def int
	}{
		{"memory_mib", &req.MemoryMiB, MinMemoryMiB, MaxMemoryMiB, DefaultMemoryMiB},
		{"vcpus", &req.VCPUs, MinVCPUs, MaxVCPUs, DefaultVCPUs},
		{"disk_gib", &req.DiskGiB, MinDiskGiB, MaxDiskGiB, DefaultDiskGiB},
	}
	if req.From != nil {
		for _, r := range resources {
			if *r.v != nil {
				return SandboxCreateRequest{}, jsend.InvalidField(r.field, r.field+" cannot be given with from: a fork takes its resources from the snapshot")
			}
		}
		ref := ValidSnapshotRef(req.From.Snapshot)
		if !ref && !ValidSnapshotID(req.From.Snapshot) && !ValidSnapshotName(req.From.Snapshot) {
			return SandboxCreateRequest{}, jsend.InvalidField("from.snapshot", `from.snapshot must be a snapshot's id ("v1", "auto-1"…), name or ref ("sn-…")`)
		}
		switch {
		case req.From.Sandbox == "" && !ref:
			return SandboxCreateRequest{}, jsend.InvalidField("from.sandbox", `from.sandbox is required unless from.snapshot is a snapshot's ref ("sn-…")`)
		case req.From.Sandbox != "" && !ValidSandboxID(req.From.Sandbox):
			return SandboxCreateRequest{}, jsend.InvalidField("from.sandbox", "from.sandbox must be a sandbox's id or name")
		}
		return req, nil
	}
	for _, r := range resources {
		if *r.v == nil {
			d := r.def
			*r.v = &d
			continue
		}
		if n := **r.v; n < r.min || n > r.max {
			return SandboxCreateRequest{}, jsend.InvalidField(r.field, fmt.Sprintf("%s must be %d to %d", r.field, r.min, r.max)).
				With("min", r.min).With("max", r.max)
		}
	}
	return req, nil
}

// ValidateSandboxName checks a sandbox name: 1 to 63 characters, each a
// lowercase ASCII letter, a digit or '-', the first a letter and the last
// not '-', and not starting with SandboxIDPrefix ("sb-"). That is an RFC
// 1123 host name label, so a name is safe as the guest's host name, in a
// DNS name and in a file name, and needs no quoting in a shell or a log;
// and since every id the API makes starts with "sb-", a name never looks
// like an id: a name works wherever an id does (in every route, in a
// fork's from) and never means another sandbox than the id would. It
// fails with invalid_field naming "name".
func ValidateSandboxName(name string) error {
	if strings.HasPrefix(name, SandboxIDPrefix) {
		return jsend.InvalidField("name", "a name may not look like a sandbox id: it may not start with sb-").With("limit", MaxSandboxName)
	}
	if !validSandboxName(name) {
		return jsend.InvalidField("name", "name must be 1 to 63 lowercase letters, digits and '-', starting with a letter and not ending with '-'").
			With("limit", MaxSandboxName)
	}
	return nil
}

// ValidSandboxName reports whether ValidateSandboxName accepts name.
func ValidSandboxName(name string) bool { return ValidateSandboxName(name) == nil }

func validSandboxName(name string) bool {
	if len(name) == 0 || len(name) > MaxSandboxName || !lower(name[0]) || name[len(name)-1] == '-' || strings.HasPrefix(name, SandboxIDPrefix) {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !lower(c) && !digit(c) && c != '-' {
			return false
		}
	}
	return true
}

// ValidSandboxID reports whether id has the shape of a sandbox id, the
// check of the {id} path segment before any lookup. The API makes ids of
// "sb-" and 1 to 40 lowercase letters and digits (MintedSandboxID), but
// the sandboxes of hostproxy's configuration file keep the ids they were
// given ("sb-local", "sb-a1"), under the file's rule: 1 to 64 ASCII
// letters, digits, '.', '_' and '-', the first a letter or a digit. Both
// are accepted, so that no configured sandbox becomes unreachable.
func ValidSandboxID(id string) bool {
	if len(id) == 0 || len(id) > 64 || !lower(id[0]) && !upper(id[0]) && !digit(id[0]) {
		return false
	}
	for i := 1; i < len(id); i++ {
		if c := id[i]; !lower(c) && !upper(c) && !digit(c) && c != '.' && c != '_' && c != '-' {
			return false
		}
	}
	return true
}

// MintedSandboxID reports whether id has the shape of the ids the API
// makes: "sb-" and 1 to 40 lowercase letters and digits.
func MintedSandboxID(id string) bool {
	rest, ok := strings.CutPrefix(id, SandboxIDPrefix)
	if !ok || len(rest) == 0 || len(rest) > 40 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		if c := rest[i]; !lower(c) && !digit(c) {
			return false
		}
	}
	return true
}

// ValidSnapshotID reports whether id has the shape of a VM snapshot id:
// "v" or "auto-" followed by a positive decimal number of at most 9
// digits without leading zeros ("v1", "v12", "auto-3").
func ValidSnapshotID(id string) bool {
	n, ok := strings.CutPrefix(id, "v")
	if !ok {
		if n, ok = strings.CutPrefix(id, "auto-"); !ok {
			return false
		}
	}
	if len(n) == 0 || len(n) > 9 || n[0] == '0' {
		return false
	}
	for i := 0; i < len(n); i++ {
		if !digit(n[i]) {
			return false
		}
	}
	return true
}

func lower(c byte) bool { return c >= 'a' && c <= 'z' }
func upper(c byte) bool { return c >= 'A' && c <= 'Z' }
func digit(c byte) bool { return c >= '0' && c <= '9' }
