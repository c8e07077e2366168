package cli

import (
	"encoding/json"
	"net/http"
	"time"

	"strata/client"
)

// The CLI drives the API through the exported client (package client);
// these are its names here.
type (
	Client                = client.Client
	APIError              = client.Error
	Token                 = client.Token
	Checkpoint            = client.Checkpoint
	Restored              = client.Restored
	Sandbox               = client.Sandbox
	NetworkUsage          = client.NetworkUsage
	SandboxState          = client.SandboxState
	ExecResult            = client.ExecResult
	Snapshot              = client.Snapshot
	SnapshotCreateRequest = client.SnapshotCreateRequest
	Retention             = client.Retention
	SnapshotRestored      = client.SnapshotRestored
	ForkRequest           = client.ForkRequest
	Forks                 = client.Forks
	ForkRefusal           = client.ForkRefusal
	Change                = client.Change
	Entry                 = client.Entry
	Session               = client.Session
	ListOptions           = client.ListOptions
)

// Snapshot statuses, and the retention mode.
const (
	SnapshotProcessing    = client.SnapshotProcessing
	SnapshotReady         = client.SnapshotReady
	SnapshotFailed        = client.SnapshotFailed
	RetentionDeleteOldest = client.RetentionDeleteOldest
)

// Waiting for a sandbox on its way to a state (client.MinPoll,
// client.MaxWait).
const (
	minPoll = client.MinPoll
	maxWait = client.MaxWait
)

func newHTTPClient(timeout time.Duration) *http.Client { return client.NewHTTPClient(timeout) }

func sandboxPath(sandbox string, rest ...string) string { return client.SandboxPath(sandbox, rest...) }

// rawAnswer keeps a call's data as the server sent it (client.Raw): what
// -o json prints.
func rawAnswer(dst *json.RawMessage) client.CallOption { return client.Raw(dst) }
