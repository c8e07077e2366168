package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"

	"strata/internal/fault"
	"strata/internal/jsend"
)

// Limits of an exec request (POST /v1/sandboxes/{id}/exec, and guestd's
// POST /v1/exec), as the contract states them.
const (
	// MaxExecArgs is the most strings cmd may hold.
	MaxExecArgs = 256
	// MaxExecCmdBytes bounds the bytes of all of cmd's strings together.
	MaxExecCmdBytes = 64 << 10
	// MaxExecEnv is the most entries env may hold.
	MaxExecEnv = 64
	// MaxExecEnvEntry bounds one env entry: its key's bytes plus its
	// value's.
	MaxExecEnvEntry = 4 << 10
	// MaxExecStdin bounds stdin, in bytes.
	MaxExecStdin = 1 << 20
	// MaxExecTimeoutS is the longest timeout_s; the shortest is 1.
	MaxExecTimeoutS = 3600
	// DefaultExecTimeoutS is timeout_s when it is left out.
	DefaultExecTimeoutS = 60
	// MaxExecOutput is what is kept of each of stdout and stderr, in
	// bytes, before encoding; the rest is read and dropped (truncated).
	MaxExecOutput = 1 << 20
	// MaxExecBody is the largest exec request body, in place of the 16 KiB
	// of the other operations (jsend.MaxBody). It is sized for the largest
	// valid request written the longest way JSON allows: 1 MiB of stdin,
	// 64 KiB of cmd and 64 env entries of 4 KiB, every byte escaped as
	// \u00XX (six bytes; Go's encoder writes '<', '>' and '&' so), is
	// about 7.9 MiB. A smaller limit would refuse valid requests.
	MaxExecBody = 8 << 20
)

// Encodings of an exec's stdout and stderr.
const (
	// EncodingUTF8 returns the streams as JSON strings; a byte sequence
	// that is not valid UTF-8 is replaced by U+FFFD.
	EncodingUTF8 = "utf-8"
	// EncodingBase64 returns the streams as standard, padded base64: the
	// exact bytes.
	EncodingBase64 = "base64"
)

// ExecRequest is the body of an exec: a program started directly (no
// shell) with cmd as its argv, in cwd, with env added to the guest's base
// environment, stdin as its standard input, killed with its whole process
// group after timeout_s. ParseExec returns it with every default filled
// in; a client may leave the optional fields zero (they are omitted).
type ExecRequest struct {
	Cmd      []string          `json:"cmd"`
	Cwd      string            `json:"cwd,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	TimeoutS int               `json:"timeout_s,omitempty"`
	Encoding string            `json:"encoding,omitempty"`
}

// ExecResult is the data of a finished exec. A non-zero exit code is a
// success of the call. ExitCode is the program's exit status, 128+N when
// signal N killed it, and -1 when it was killed because timeout_s passed
// (TimedOut; -1 is no status a program can exit with, so the two never
// mix up). Stdout and Stderr are encoded as the request's encoding says;
// Truncated tells that at least one of them was longer than MaxExecOutput
// and was cut there.
type ExecResult struct {
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	TimedOut   bool   `json:"timed_out"`
	Truncated  bool   `json:"truncated"`
	DurationMS int64  `json:"duration_ms"`
}

// CodeExecFailed is the code of an exec whose program could not be
// started (422).
const CodeExecFailed = "exec_failed"

// ExecFailed is the 422 exec_failed error: the program could not be
// started; reason is one sentence saying why (not found, not executable,
// cwd missing…), shown to the client.
func ExecFailed(reason string) *fault.Error {
	return fault.New(fault.Unprocessable, CodeExecFailed, reason)
}

// ErrExecBodyTooLarge is body_too_large for an exec body over
// MaxExecBody.
var ErrExecBodyTooLarge = fault.New(fault.TooLarge, "body_too_large", "the request body is larger than 8 MiB").With("limit", MaxExecBody)

// execWire is the body as sent: pointers tell a field left out from one
// sent empty or zero.
type execWire struct {
	Cmd      *[]string          `json:"cmd"`
	Cwd      *string            `json:"cwd"`
	Env      *map[string]string `json:"env"`
	Stdin    *string            `json:"stdin"`
	TimeoutS *int               `json:"timeout_s"`
	Encoding *string            `json:"encoding"`
}

// ParseExec decodes and validates an exec body under the API's rules and
// returns it with its defaults filled in. The body is exactly one JSON
// object (invalid_json, unknown_field, invalid_field for a wrong type) of
// at most MaxExecBody bytes (body_too_large), and:
//
//   - cmd is required: 1 to 256 strings of at most 64 KiB together, none
//     holding a NUL byte (cmd[0] is the program: a name looked up in PATH,
//     or a path);
//   - cwd is an absolute path without NUL; default "/";
//   - env has at most 64 entries; each key is non-empty without '=' or
//     NUL, each value without NUL (the kernel could not pass them), and
//     key and value together are at most 4 KiB; an empty env is nil;
//   - stdin is at most 1 MiB;
//   - timeout_s is 1 to 3600; default 60;
//   - encoding is "utf-8" (the default) or "base64".
//
// A null field is a field left out. Each broken rule is invalid_field
// naming the field ("cmd", "cwd", "env", "stdin", "timeout_s",
// "encoding").
func ParseExec(body []byte) (ExecRequest, error) {
	if len(body) > MaxExecBody {
		return ExecRequest{}, ErrExecBodyTooLarge
	}
	var w execWire
	if err := jsend.DecodeBytes(body, &w); err != nil {
		return ExecRequest{}, err
	}
	req := ExecRequest{Cwd: "/", TimeoutS: DefaultExecTimeoutS, Encoding: EncodingUTF8}

	if w.Cmd == nil {
		return ExecRequest{}, jsend.InvalidField("cmd", "cmd is required: the program and its arguments, as an array of strings")
	}
	req.Cmd = *w.Cmd
	if err := checkCmd(req.Cmd); err != nil {
		return ExecRequest{}, err
	}

	if w.Cwd != nil {
		req.Cwd = *w.Cwd
		if !strings.HasPrefix(req.Cwd, "/") || strings.ContainsRune(req.Cwd, 0) {
			return ExecRequest{}, jsend.InvalidField("cwd", "cwd must be an absolute path without NUL bytes")
		}
	}

	if w.Env != nil && len(*w.Env) > 0 {
		req.Env = *w.Env
		if err := checkEnv(req.Env); err != nil {
			return ExecRequest{}, err
		}
	}

	if w.Stdin != nil {
		req.Stdin = *w.Stdin
		if len(req.Stdin) > MaxExecStdin {
			return ExecRequest{}, jsend.InvalidField("stdin", "stdin must be at most 1 MiB").With("limit", MaxExecStdin)
		}
	}

	if w.TimeoutS != nil {
		req.TimeoutS = *w.TimeoutS
		if req.TimeoutS < 1 || req.TimeoutS > MaxExecTimeoutS {
			return ExecRequest{}, jsend.InvalidField("timeout_s", "timeout_s must be 1 to 3600 seconds").With("limit", MaxExecTimeoutS)
		}
	}

	if w.Encoding != nil {
		req.Encoding = *w.Encoding
		if req.Encoding != EncodingUTF8 && req.Encoding != EncodingBase64 {
			return ExecRequest{}, jsend.InvalidField("encoding", `encoding must be "utf-8" or "base64"`)
		}
	}
	return req, nil
}

func checkCmd(cmd []string) error {
	switch {
	case len(cmd) == 0:
		return jsend.InvalidField("cmd", "cmd must hold at least the program")
	case len(cmd) > MaxExecArgs:
		return jsend.InvalidField("cmd", "cmd must hold at most 256 strings").With("limit", MaxExecArgs)
	}
	total := 0
	for i, s := range cmd {
		total += len(s)
		if strings.ContainsRune(s, 0) {
			return jsend.InvalidField("cmd", fmt.Sprintf("cmd[%d] contains a NUL byte", i)).With("index", i)
		}
	}
	if total > MaxExecCmdBytes {
		return jsend.InvalidField("cmd", "the strings of cmd must be at most 64 KiB together").With("limit", MaxExecCmdBytes)
	}
	return nil
}

func checkEnv(env map[string]string) error {
	if len(env) > MaxExecEnv {
		return jsend.InvalidField("env", "env must hold at most 64 entries").With("limit", MaxExecEnv)
	}
	for k, v := range env {
		switch {
		case k == "":
			return jsend.InvalidField("env", "an env key must not be empty")
		case strings.ContainsAny(k, "=\x00"):
			return jsend.InvalidField("env", fmt.Sprintf("env key %q contains '=' or a NUL byte", k))
		case strings.ContainsRune(v, 0):
			return jsend.InvalidField("env", fmt.Sprintf("the value of env key %q contains a NUL byte", k))
		case len(k)+len(v) > MaxExecEnvEntry:
			return jsend.InvalidField("env", fmt.Sprintf("env entry %q is over 4 KiB (key and value together)", k)).With("limit", MaxExecEnvEntry)
		}
	}
	return nil
}

// ReadExec reads and checks an exec request as both daemons do: no query
// string, a JSON body of at most MaxExecBody, then ParseExec. It returns
// the request and the body as read (hostproxy forwards it unchanged).
func ReadExec(r *http.Request) (ExecRequest, []byte, error) {
	if err := jsend.RejectQuery(r); err != nil {
		return ExecRequest{}, nil, err
	}
	body, err := jsend.ReadBody(r, MaxExecBody, ErrExecBodyTooLarge)
	if err != nil {
		return ExecRequest{}, nil, err
	}
	req, err := ParseExec(body)
	if err != nil {
		return ExecRequest{}, nil, err
	}
	return req, body, nil
}

// WithSandboxEnv is an exec or session body (checked already: ParseExec,
// ParseSession) whose env is call, given the sandbox's env base under it
// (MergeEnv): the body's other members as they were sent, env replaced
// by the merge, written without HTML escapes so that it grows by no more
// than the merge's bytes. A sandbox without env leaves the body as it
// is. The merge's error (more than MaxExecEnv entries together) is the
// answer; guestd then never sees the call.
func WithSandboxEnv(body []byte, base, call map[string]string) ([]byte, error) {
	if len(base) == 0 {
		return body, nil
	}
	env, err := MergeEnv(base, call)
	if err != nil {
		return nil, err
	}
	var members map[string]json.RawMessage
	if err := json.Unmarshal(body, &members); err != nil {
		return nil, fmt.Errorf("exec body: %w", err)
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(env); err != nil {
		return nil, err
	}
	members["env"] = bytes.TrimSpace(b.Bytes())
	var out bytes.Buffer
	enc = json.NewEncoder(&out)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(members); err != nil {
		return nil, err
	}
	return bytes.TrimSpace(out.Bytes()), nil
}
