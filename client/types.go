package client

import (
	"strata/egress/policy"
	"strata/internal/api"
)

// The API's records and requests, under names a program outside this
// module can use (the package that defines them is internal).
type (
	SandboxCreateRequest = api.SandboxCreateRequest
	Network              = api.Network
	NetworkUsage         = api.NetworkUsage
	NetworkSetting       = policy.Spec
	SandboxList          = api.SandboxList
	ExecRequest          = api.ExecRequest
	SessionRequest       = api.SessionRequest
	SessionControl       = api.SessionControl
	Directory            = api.Directory
	RestorePathsResult   = api.RestorePathsResult
	CloneResult          = api.CloneResult
	ReleaseResult        = api.ReleaseResult
	FileWritten          = api.FileWritten
	FileListing          = api.FileListing
	FileEntry            = api.FileEntry
	Scope                = api.Scope
	Access               = api.Access
)

// Streams of a session attachment's binary frames (their first byte).
const (
	StreamStdin  = api.StreamStdin
	StreamStdout = api.StreamStdout
	StreamStderr = api.StreamStderr
)
