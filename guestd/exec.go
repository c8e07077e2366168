package guestd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
	"unicode/utf8"

	"strata/internal/api"
	"strata/internal/httpx"
)

// execBaseEnv is the environment every program starts from.
var execBaseEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME": "/root",
	"LANG": "C.UTF-8",
}

// execPipeGrace is how long output is still read after the program
// exited (or was killed) while another process holds its pipes open.
const execPipeGrace = 2 * time.Second

// execute handles POST /v1/exec: it runs one program inside the sandbox
// and answers api.ExecResult.
//
// The program is started directly, without a shell: cmd[0] is a path
// (relative ones are taken from cwd) or a name looked up in the PATH of
// the program's environment (absolute entries only). That environment is
// execBaseEnv, then the variables of the credentials file guestd writes
// (CREATEOS_API_URL, CREATEOS_SANDBOX_ID, CREATEOS_API_KEY) when it
// exists, then the request's env, each layer overriding the one before.
//
// The program leads a process group of its own. When timeout_s passes,
// or the request's context ends (the client went away), the whole group
// is killed with SIGKILL, so a shell's children die with it; processes
// that left the group (setsid) are not followed. A timed-out run answers
// timed_out with exit_code -1, a status no program can exit with; a
// program killed by signal N otherwise answers 128+N, as a shell says.
//
// stdout and stderr are read to their end, the first MaxExecOutput bytes
// of each kept and the rest dropped (truncated), so the program never
// blocks on a full pipe. Processes the program leaves running keep
// running after it exits; what they write is read for execPipeGrace more,
// then their pipes are closed.
//
// A program that cannot be started (not found, not executable, cwd
// missing) is 422 exec_failed with a sentence saying why.
func (s *Server) execute(r *http.Request) (any, error) {
	req, _, err := api.ReadExec(r)
	if err != nil {
		return nil, err
	}
	env := execEnv(credentialsEnv(s.credentialsPath, s.log), req.Env)
	res, err := runExec(r.Context(), req, env)
	if err != nil {
		return nil, err
	}
	httpx.Annotate(r.Context(), slog.Int("exit_code", res.ExitCode), slog.Bool("timed_out", res.TimedOut), slog.Bool("truncated", res.Truncated))
	return res, nil
}

// credentialsEnv reads the env file that credentials writes (lines of
// NAME='value', values without quotes); a missing file is no variables.
func credentialsEnv(path string, log *slog.Logger) map[string]string {
	b, err := os.ReadFile(path)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) && log != nil {
			log.Warn("exec: the credentials file cannot be read; programs start without it", "err", err)
		}
		return nil
	}
	vars := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		name, value, ok := strings.Cut(sc.Text(), "=")
		if !ok || name == "" {
			continue
		}
		vars[name] = strings.TrimSuffix(strings.TrimPrefix(value, "'"), "'")
	}
	return vars
}

// execEnv layers the base environment, the credentials and the request's
// env, and returns it as NAME=value strings sorted by name.
func execEnv(credentials, env map[string]string) []string {
	all := maps.Clone(execBaseEnv)
	maps.Copy(all, credentials)
	maps.Copy(all, env)
	out := make([]string, 0, len(all))
	for _, k := range slices.Sorted(maps.Keys(all)) {
		out = append(out, k+"="+all[k])
	}
	return out
}

// runExec runs req with the environment env (NAME=value strings) and
// waits for it. It fails with exec_failed when the program cannot be
// started, and with ctx's error when ctx ended first (the process group
// is killed then).
func runExec(ctx context.Context, req api.ExecRequest, env []string) (api.ExecResult, error) {
	if err := checkCwd(req.Cwd); err != nil {
		return api.ExecResult{}, err
	}
	path, err := findProgram(req.Cmd[0], req.Cwd, envPath(env))
	if err != nil {
		return api.ExecResult{}, err
	}
	// The duration is measured from the same instant as the deadline: a
	// program killed at its timeout has run for timeout_s, not a few
	// milliseconds of setup less.
	start := time.Now()
	tctx, cancel := context.WithDeadline(ctx, start.Add(time.Duration(req.TimeoutS)*time.Second))
	defer cancel()
	cmd := exec.CommandContext(tctx, path)
	cmd.Args = req.Cmd
	cmd.Dir = req.Cwd
	cmd.Env = env
	if req.Stdin != "" {
		cmd.Stdin = strings.NewReader(req.Stdin) // else /dev/null
	}
	stdout, stderr := &capped{max: api.MaxExecOutput}, &capped{max: api.MaxExecOutput}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var killed atomic.Bool
	cmd.Cancel = func() error {
		killed.Store(true)
		// The group's id is the leader's pid (Setpgid), and the leader is
		// not reaped before Wait returns, so the id is still ours.
		if err := syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			return err
		}
		return nil
	}
	cmd.WaitDelay = execPipeGrace

	if err := cmd.Start(); err != nil {
		return api.ExecResult{}, startError(req.Cmd[0], err)
	}
	err = cmd.Wait()
	elapsed := time.Since(start)
	if ctx.Err() != nil {
		return api.ExecResult{}, fmt.Errorf("exec: the request ended before the program; its process group was killed: %w", ctx.Err())
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) && !errors.Is(err, exec.ErrWaitDelay) && !errors.Is(err, context.DeadlineExceeded) {
		return api.ExecResult{}, fmt.Errorf("exec: wait: %w", err)
	}
	res := api.ExecResult{
		ExitCode:   exitCode(cmd.ProcessState),
		TimedOut:   killed.Load() && errors.Is(tctx.Err(), context.DeadlineExceeded),
		Truncated:  stdout.dropped || stderr.dropped,
		DurationMS: elapsed.Milliseconds(),
	}
	if res.TimedOut {
		res.ExitCode = -1
	}
	res.Stdout = encodeOutput(stdout, req.Encoding)
	res.Stderr = encodeOutput(stderr, req.Encoding)
	return res, nil
}

// exitCode is the program's exit status, or 128+N when signal N killed it.
func exitCode(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}

// checkCwd fails with exec_failed unless dir is a directory.
func checkCwd(dir string) error {
	fi, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return api.ExecFailed(fmt.Sprintf("the working directory %s does not exist", dir)).With("cwd", dir)
	case err != nil:
		return api.ExecFailed(fmt.Sprintf("the working directory %s cannot be used: %s", dir, errnoText(err))).With("cwd", dir)
	case !fi.IsDir():
		return api.ExecFailed(fmt.Sprintf("the working directory %s is not a directory", dir)).With("cwd", dir)
	}
	return nil
}

// envPath is the PATH of env, the program's environment.
func envPath(env []string) string {
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			return v
		}
	}
	return ""
}

// findProgram resolves cmd[0]: a name with a '/' is a path (relative to
// cwd); a bare name is looked up in the absolute directories of path, the
// first executable regular file winning. It fails with exec_failed.
func findProgram(name, cwd, path string) (string, error) {
	if name == "" {
		return "", api.ExecFailed("cmd[0] is empty: there is no program to run").With("program", name)
	}
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(cwd, p)
		}
		if err := checkExecutable(p); err != nil {
			return "", api.ExecFailed(fmt.Sprintf("program %s %s", name, err)).With("program", name)
		}
		return p, nil
	}
	for _, dir := range filepath.SplitList(path) {
		if !filepath.IsAbs(dir) {
			continue
		}
		p := filepath.Join(dir, name)
		if checkExecutable(p) == nil {
			return p, nil
		}
	}
	return "", api.ExecFailed(fmt.Sprintf("program %s is not found in PATH (%s)", name, path)).With("program", name)
}

// checkExecutable tells, as the end of a sentence, why p cannot be run.
func checkExecutable(p string) error {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return errors.New("does not exist")
	case err != nil:
		return fmt.Errorf("cannot be used: %s", errnoText(err))
	case fi.IsDir():
		return errors.New("is a directory")
	case !fi.Mode().IsRegular():
		return errors.New("is not a regular file")
	case fi.Mode().Perm()&0o111 == 0:
		return errors.New("is not executable (no execute permission)")
	}
	return nil
}

// startError turns the error of starting name into exec_failed. Start
// fails after the checks above only in a race or for what they cannot
// see: a script whose interpreter is missing, a binary of another
// architecture, a noexec mount.
func startError(name string, err error) error {
	var why string
	switch {
	case errors.Is(err, syscall.ENOENT):
		why = "or its interpreter does not exist"
	case errors.Is(err, syscall.EACCES):
		why = "cannot be executed: permission denied (a noexec mount, or a directory on the way that cannot be searched)"
	case errors.Is(err, syscall.ENOEXEC):
		why = "is not in an executable format this machine runs"
	case errors.Is(err, syscall.E2BIG):
		why = "cannot be started: its arguments and environment are too long"
	default:
		why = "cannot be started: " + errnoText(err)
	}
	return api.ExecFailed(fmt.Sprintf("program %s %s", name, why)).With("program", name).Wrap(err)
}

// errnoText is the system's sentence for err's errno ("permission
// denied"), without the paths and operations of its wrappers.
func errnoText(err error) string {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		return errno.Error()
	}
	return "an error of the system"
}

// capped keeps the first max bytes written to it and drops the rest,
// never failing a write, so that the program's pipe is always drained.
type capped struct {
	buf     []byte
	max     int
	dropped bool
}

func (c *capped) Write(p []byte) (int, error) {
	room := c.max - len(c.buf)
	if len(p) > room {
		c.dropped = true
		c.buf = append(c.buf, p[:room]...)
	} else {
		c.buf = append(c.buf, p...)
	}
	return len(p), nil
}

// encodeOutput renders what c kept: base64 as is; utf-8 with each run of
// bytes that are not valid UTF-8 replaced by one U+FFFD, after dropping
// the start of a character that the cut at MaxExecOutput split.
func encodeOutput(c *capped, encoding string) string {
	if encoding == api.EncodingBase64 {
		return base64.StdEncoding.EncodeToString(c.buf)
	}
	b := c.buf
	if c.dropped {
		for i := 1; i <= utf8.UTFMax-1 && i <= len(b); i++ {
			if utf8.RuneStart(b[len(b)-i]) {
				if !utf8.FullRune(b[len(b)-i:]) {
					b = b[:len(b)-i]
				}
				break
			}
		}
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
