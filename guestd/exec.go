package guestd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"strata/internal/api"
	"strata/internal/httpx"
)

// execBaseEnv is the environment every program starts from.
var execBaseEnv = map[string]string{
	"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME": "/root",
	"LANG": "C.UTF-8",
}

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
// The program leads a process group of its own; inside a microVM (with
// exec cgroups, see cgroup.go) it also starts in a cgroup of its own,
// whose memory and task limits leave guestd its share of the guest. The
// exec lasts until the program has exited and its stdout and stderr are
// closed (processes it leaves running in the background, their output
// sent elsewhere, keep running), or until timeout_s passes, or the
// request's context ends (the client went away): the exec is killed then,
// its whole cgroup (cgroup.kill: processes that left the process group or
// double-forked too), or outside a microVM its process group, with
// SIGKILL. The answer comes at most execKillGrace after the kill,
// whatever the killed processes do. A timed-out run answers timed_out
// with exit_code -1, a status no program can exit with; a program killed
// by signal N otherwise answers 128+N, as a shell says (137 for a program
// the out-of-memory killer took: the whole exec is killed then).
//
// stdout and stderr are read to their end, the first MaxExecOutput bytes
// of each kept and the rest dropped (truncated), so the program never
// blocks on a full pipe.
//
// A program that cannot be started (not found, not executable, cwd
// missing) is 422 exec_failed with a sentence saying why.
func (s *Server) execute(r *http.Request) (any, error) {
	req, _, err := api.ReadExec(r)
	if err != nil {
		return nil, err
	}
	env := execEnv(credentialsEnv(s.credentialsPath, s.log), req.Env)
	res, err := runExec(r.Context(), req, env, s.cgroups, s.log)
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

// execKillGrace is how long, after an exec is killed (its timeout, or
// its request ended), its program is still waited for and its output
// read: within it the killed processes exit and their pipes close; past
// it, a process that has not died (stuck in the kernel) or a holder of
// the pipes that the kill did not reach (outside the exec's cgroup) no
// longer holds the answer.
const execKillGrace = time.Second

// runExec runs req with the environment env (NAME=value strings) and
// waits for it: until its program has exited and its output is closed,
// or until its timeout, when it is killed. With cg (inside a microVM)
// the program runs in a cgroup of its own, which is killed whole; without,
// the program's process group is killed. It fails with exec_failed when
// the program cannot be started, and with ctx's error when ctx ended
// first (the program is killed then).
func runExec(ctx context.Context, req api.ExecRequest, env []string, cg *execCgroups, log *slog.Logger) (api.ExecResult, error) {
	if err := checkCwd(req.Cwd); err != nil {
		return api.ExecResult{}, err
	}
	path, err := findProgram(req.Cmd[0], req.Cwd, envPath(env))
	if err != nil {
		return api.ExecResult{}, err
	}
	var group *execCgroup
	if cg != nil {
		if group, err = cg.create(); err != nil {
			return api.ExecResult{}, err
		}
	}
	// The duration is measured from the same instant as the deadline: a
	// program killed at its timeout has run for timeout_s, not a few
	// milliseconds of setup less.
	start := time.Now()
	deadline := start.Add(time.Duration(req.TimeoutS) * time.Second)
	p, err := startExec(req, path, env, cg, group)
	if err != nil {
		if group != nil {
			group.remove()
		}
		return api.ExecResult{}, err
	}
	killed, timedOut := false, false
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		killed, timedOut = true, true
	case <-ctx.Done():
		killed = true
	}
	if killed {
		p.kill(log)
		grace := time.NewTimer(execKillGrace)
		select {
		case <-p.done:
		case <-grace.C:
		}
		grace.Stop()
	}
	exited := p.stop()
	elapsed := time.Since(start)
	if group != nil {
		if n := group.oomKills(); n > 0 {
			httpx.Annotate(ctx, slog.Uint64("oom_kills", n))
		}
	}
	if exited {
		err = p.cmd.Wait() // reaps the leader: after the kill, so its pgid was still its own
		cleanupGroup(group, killed)
	} else {
		// Not dead within the grace (stuck in the kernel): reaped, and its
		// cgroup removed, when it dies.
		go func() {
			<-p.exited
			p.cmd.Wait()
			cleanupGroup(group, true)
		}()
	}
	if ctx.Err() != nil && !timedOut {
		return api.ExecResult{}, fmt.Errorf("exec: the request ended before the program; it was killed: %w", ctx.Err())
	}
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		return api.ExecResult{}, fmt.Errorf("exec: wait: %w", err)
	}
	res := api.ExecResult{
		ExitCode:   -1,
		TimedOut:   timedOut,
		Truncated:  p.stdout.dropped || p.stderr.dropped,
		DurationMS: elapsed.Milliseconds(),
	}
	if !timedOut {
		res.ExitCode = exitCode(p.cmd.ProcessState)
	}
	res.Stdout = encodeOutput(p.stdout, req.Encoding)
	res.Stderr = encodeOutput(p.stderr, req.Encoding)
	return res, nil
}

// execProcess is a started program: its leader, and the pipes of its
// standard streams, read (stdout, stderr) and written (stdin) by
// goroutines of their own.
type execProcess struct {
	cmd            *exec.Cmd
	group          *execCgroup // nil outside a microVM
	stdout, stderr *capped

	// parent ends of the pipes; closing them ends the goroutines.
	outR, errR, inW *os.File
	copies          sync.WaitGroup

	// exited is closed when the leader has exited (not yet reaped);
	// output when stdout and stderr are closed by every process holding
	// them; done when both.
	exited, output, done chan struct{}
}

// startExec starts the program of req (path) with its pipes, in group
// when there is one.
func startExec(req api.ExecRequest, path string, env []string, cg *execCgroups, group *execCgroup) (_ *execProcess, err error) {
	p := &execProcess{group: group, stdout: &capped{max: api.MaxExecOutput}, stderr: &capped{max: api.MaxExecOutput},
		exited: make(chan struct{}), output: make(chan struct{}), done: make(chan struct{})}
	var child []*os.File // the child's ends, closed here once it has them
	defer func() {
		for _, f := range child {
			f.Close()
		}
		if err != nil {
			for _, f := range []*os.File{p.outR, p.errR, p.inW} {
				if f != nil {
					f.Close()
				}
			}
		}
	}()
	outW, errW, inR := (*os.File)(nil), (*os.File)(nil), (*os.File)(nil)
	if p.outR, outW, err = os.Pipe(); err != nil {
		return nil, err
	}
	child = append(child, outW)
	if p.errR, errW, err = os.Pipe(); err != nil {
		return nil, err
	}
	child = append(child, errW)
	cmd := exec.Command(path)
	cmd.Args = req.Cmd
	cmd.Dir = req.Cwd
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	if req.Stdin != "" { // else /dev/null
		if inR, p.inW, err = os.Pipe(); err != nil {
			return nil, err
		}
		child = append(child, inR)
		cmd.Stdin = inR
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	p.cmd = cmd
	if group != nil {
		err = cg.start(cmd, group)
	} else {
		err = cmd.Start()
	}
	if err != nil {
		return nil, startError(req.Cmd[0], err)
	}
	p.copies.Add(2)
	for _, c := range []struct {
		dst *capped
		src *os.File
	}{{p.stdout, p.outR}, {p.stderr, p.errR}} {
		go func() {
			defer p.copies.Done()
			io.Copy(c.dst, c.src)
		}()
	}
	go func() {
		p.copies.Wait()
		close(p.output)
	}()
	if p.inW != nil {
		go func() {
			// A program that does not read its stdin fails the write when
			// it exits (EPIPE) or stop closes the pipe: nothing to report.
			io.WriteString(p.inW, req.Stdin)
			p.inW.Close()
		}()
	}
	go func() {
		waitExited(cmd.Process.Pid)
		close(p.exited)
	}()
	go func() {
		<-p.exited
		<-p.output
		close(p.done)
	}()
	return p, nil
}

// waitExited waits until process pid has exited, without reaping it
// (WNOWAIT): until Wait reaps it, its pid, and so its process group's
// id, stay its own and a kill of the group reaches no other.
func waitExited(pid int) {
	var info unix.Siginfo
	for {
		err := unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// kill kills the exec: its cgroup whole when it has one, else its process
// group (processes that left the group, setsid, are not reached then).
func (p *execProcess) kill(log *slog.Logger) {
	if p.group != nil {
		err := p.group.kill()
		if err == nil {
			return
		}
		log.Warn("exec: cgroup.kill failed; killing the process group", "cgroup", p.group.name, "err", err)
	}
	// The leader is not reaped before kill (Wait comes after), so -pid is
	// still its group's id even when the leader itself has exited.
	if err := syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		log.Warn("exec: kill", "pgid", p.cmd.Process.Pid, "err", err)
	}
}

// stop closes the parent's ends of the pipes, which ends the goroutines
// that read and write them, waits for those, and tells whether the
// leader has exited. What the program wrote is in stdout and stderr
// from then on.
func (p *execProcess) stop() bool {
	for _, f := range []*os.File{p.outR, p.errR, p.inW} {
		if f != nil {
			f.Close()
		}
	}
	p.copies.Wait()
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// cleanupGroup removes an exec's (or a session's) cgroup once its
// program is reaped. Its background processes keep it (it is removed by a
// sweep once they end); after a kill it is empty within moments, and its
// removal is retried for a while.
func cleanupGroup(group *execCgroup, killed bool) {
	if group == nil {
		return
	}
	if !killed {
		group.remove()
		return
	}
	go func() {
		for range 100 {
			if err := unix.Unlinkat(int(group.parent.dir.Fd()), group.name, unix.AT_REMOVEDIR); !errors.Is(err, unix.EBUSY) {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		group.dir.Close()
		group.parent.forget(group.name)
	}()
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
