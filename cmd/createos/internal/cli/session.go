package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/coder/websocket"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	"strata/client"
	"strata/internal/api"
)

// stdin is what -i forwards; a terminal here (-t) is put in raw mode.
var stdin io.Reader = os.Stdin

// follow copies session id's output here from output offset since
// until the session's exit (its code: -1 when its timeout killed it).
// With in, stdin goes to the session (its end as "eof"); with ttyFd a
// terminal (-t), it is put in raw mode and its size follows this one's.
// quietDrop leaves out the note of the output the session no longer held
// at the first attachment (a default attach asks for the oldest byte
// held, not for byte 0).
//
// An operation on the sandbox (a memory snapshot, a pause, a restore)
// ends attachments with close code 1011, and guestd holds the session
// api.SessionAttachWait for an attachment to come again: follow attaches
// again from the offset it had reached, so that a command outlives a
// snapshot taken meanwhile, even from inside it. It attaches with the
// generation it knew (generation, else its first attachment's): when the
// sandbox was restored or forked meanwhile, the session is
// another run's, and follow ends with session_restored rather than print
// that run's output after this one's.
func (a *app) follow(ctx context.Context, c *Client, sandbox, id string, since int64, generation string, in io.Reader, ttyFd int, quietDrop bool) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu   sync.Mutex
		conn *client.Attachment // the current attachment
	)
	send := func(m api.SessionControl) error {
		mu.Lock()
		cur := conn
		mu.Unlock()
		if cur == nil {
			return errors.New("not attached")
		}
		b, _ := json.Marshal(m)
		return cur.Write(ctx, websocket.MessageText, b)
	}
	if ttyFd >= 0 {
		old, err := term.MakeRaw(ttyFd)
		if err == nil {
			defer term.Restore(ttyFd, old)
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					if cols, rows, err := term.GetSize(ttyFd); err == nil {
						send(api.SessionControl{Type: "resize", Rows: rows, Cols: cols})
					}
				case <-ctx.Done():
					return
				}
			}
		}()
	}
	// Standard input is read by one goroutine for every attachment: a
	// chunk read while one attachment ended goes to the next.
	var input chan []byte
	if in != nil {
		input = make(chan []byte)
		go func() {
			defer close(input)
			for {
				buf := make([]byte, 32<<10)
				n, err := in.Read(buf)
				if n > 0 {
					select {
					case input <- buf[:n]:
					case <-ctx.Done():
						return
					}
				}
				if err != nil {
					return // io.EOF, or stdin is unreadable: its end either way
				}
			}
		}()
	}
	var carry []byte // a chunk the last attachment could not send
	eofSent := false
	for attempt := 0; ; attempt++ {
		cur, err := a.attachAgain(ctx, c, sandbox, id, since, generation, attempt > 0)
		if err != nil {
			return 0, err
		}
		if generation == "" {
			generation = cur.Generation
		}
		mu.Lock()
		conn = cur
		mu.Unlock()
		if ttyFd >= 0 {
			if cols, rows, err := term.GetSize(ttyFd); err == nil {
				send(api.SessionControl{Type: "resize", Rows: rows, Cols: cols})
			}
		}
		actx, endWriter := context.WithCancel(ctx)
		var writing sync.WaitGroup
		if input != nil && !eofSent {
			writing.Add(1)
			go func() {
				defer writing.Done()
				for {
					b := carry
					if b == nil {
						var ok bool
						select {
						case b, ok = <-input:
						case <-actx.Done():
							return
						}
						if !ok {
							if send(api.SessionControl{Type: "eof"}) == nil {
								eofSent = true
							}
							return
						}
					}
					if cur.Write(actx, websocket.MessageBinary, append([]byte{api.StreamStdin}, b...)) != nil {
						carry = b
						return
					}
					carry = nil
				}
			}()
		}
		code, exited, err := a.copyAttachment(ctx, cur, &since, quietDrop && attempt == 0)
		endWriter()
		writing.Wait()
		cur.CloseNow()
		if exited || err != nil {
			return code, err
		}
	}
}

// attachAgain opens an attachment from since in generation (none: the
// current one); again (after an operation ended the last one) it retries
// while the sandbox is busy or not back yet, for as long as guestd holds
// the session. A generation that is no longer the guest's is
// session_restored, at once.
func (a *app) attachAgain(ctx context.Context, c *Client, sandbox, id string, since int64, generation string, again bool) (*client.Attachment, error) {
	if !again {
		conn, err := c.Attach(ctx, sandbox, id, since, generation)
		if err != nil {
			return nil, wrap(err)
		}
		return conn, nil
	}
	deadline := time.Now().Add(api.SessionAttachWait - 5*time.Second)
	for {
		conn, err := c.Attach(ctx, sandbox, id, since, generation)
		if err == nil {
			return conn, nil
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) && apiErr.Code == api.CodeSessionRestored {
			return nil, &callError{fmt.Errorf("%s: the sandbox was restored or forked while the attachment was ended: session %s is another run's now, whose output from byte %d is not what followed here; attach to that run with: createos sandbox session attach %s %s", api.CodeSessionRestored, id, since, sandbox, id)}
		}
		busy := !errors.As(err, &apiErr) || apiErr.Status == 409 && apiErr.Code != "sandbox_not_running" || apiErr.Status >= 500
		if apiErr != nil && apiErr.Code == "sandbox_not_running" {
			// A snapshot's restore or a resume on its way: running
			// again soon. Paused or stopped: not by itself.
			var state string
			json.Unmarshal(apiErr.Fields["state"], &state)
			busy = state != "paused" && state != "stopped" && state != "error"
		}
		if !busy || time.Now().After(deadline) {
			if apiErr != nil && apiErr.Code == "session_not_found" {
				return nil, errors.New("the attachment was ended by an operation on the sandbox, and the session is gone (the sandbox was restored to a moment before it, or its guestd started again)")
			}
			return nil, fmt.Errorf("the attachment was ended by an operation on the sandbox, and could not be opened again (%w); attach later with: createos sandbox session attach %s %s --since %d", wrap(err), sandbox, id, since)
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// copyAttachment copies one attachment's output here, advancing *since,
// until the session's exit (exited, with its code), an operation's end of
// the attachment (neither exited nor an error: attach again), or an
// error.
func (a *app) copyAttachment(ctx context.Context, conn *client.Attachment, since *int64, quietDrop bool) (code int, exited bool, err error) {
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			st := websocket.CloseStatus(err)
			var ce websocket.CloseError
			errors.As(err, &ce)
			switch {
			case st == websocket.StatusInternalError:
				return 0, false, nil
			case st == websocket.StatusNormalClosure:
				return 0, false, &callError{errors.New("the attachment closed before the command's exit")}
			case st != -1:
				return 0, false, &callError{fmt.Errorf("the attachment was ended (%d): %s", st, ce.Reason)}
			}
			return 0, false, &callError{fmt.Errorf("the attachment broke: %w", err)}
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			w := a.stdout
			if b[0] == api.StreamStderr {
				w = a.stderr
			}
			*since += int64(len(b) - 1)
			if _, err := w.Write(b[1:]); err != nil {
				return 0, false, err
			}
			continue
		}
		var m api.SessionControl
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case "dropped":
			*since += m.Bytes
			if !quietDrop {
				fmt.Fprintf(a.stderr, "createos: %d bytes of output were no longer held for this attachment\n", m.Bytes)
			}
		case "exit":
			conn.Close(websocket.StatusNormalClosure, "")
			if m.ExitCode == nil {
				return 1, true, nil
			}
			return *m.ExitCode, true, nil
		}
	}
}

// exitWith turns a session's exit code into createos's status: 124 when
// its timeout killed it (after a note naming timeoutS, when known: not 0),
// the code otherwise.
func (a *app) exitWith(code int, timeoutS int) error {
	switch {
	case code == -1 && timeoutS > 0:
		fmt.Fprintf(a.stderr, "createos: the command timed out after %d s; every process it started was killed\n", timeoutS)
		return &exitStatus{124}
	case code == -1:
		// An attachment does not know the session's timeout.
		fmt.Fprintln(a.stderr, "createos: the command timed out; every process it started was killed")
		return &exitStatus{124}
	case code == 0:
		return nil
	case code < 0 || code > 255:
		return &exitStatus{1}
	}
	return &exitStatus{code}
}

// runSession runs req as a session that ends with this attachment, and
// copies its streams here.
func (a *app) runSession(ctx context.Context, c *Client, sandbox string, req api.SessionRequest, interactive bool) error {
	// This terminal goes raw only when its keys go to the command (-i):
	// else ^C must still end createos here.
	ttyFd := -1
	if req.TTY && interactive {
		if f, ok := stdin.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			ttyFd = int(f.Fd())
			if cols, rows, err := term.GetSize(ttyFd); err == nil {
				req.Rows, req.Cols = rows, cols
			}
		}
	}
	se, err := c.StartSession(ctx, sandbox, req)
	if err != nil {
		return wrap(err)
	}
	// Without -i the command's stdin is empty, as a one-shot exec's: it
	// ends at once.
	in := io.Reader(strings.NewReader(""))
	if interactive {
		in = stdin
	}
	code, err := a.follow(ctx, c, sandbox, se.ID, 0, se.Generation, in, ttyFd, false)
	if err != nil {
		return err
	}
	timeout := req.TimeoutS
	if timeout == 0 {
		timeout = api.DefaultExecTimeoutS
	}
	return a.exitWith(code, timeout)
}

func (a *app) sessionCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "session",
		Short: "List, attach to and end a sandbox's exec sessions",
		Long: `An exec session is a command that runs on its own in a sandbox: 'createos
sandbox exec' runs one and ends it when it returns, 'exec --detach' starts
one that stays. Each keeps its last MiB of output for the attachments that
come later.`,
	}
	list := &cobra.Command{
		Use:   "list SANDBOX",
		Short: "List a sandbox's sessions (exited ones for 10 minutes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			all, err := c.ListSessions(cmd.Context(), args[0], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			w := a.table()
			fmt.Fprintln(w, "ID\tSTATE\tEXIT\tTTY\tDETACHABLE\tATTACHED\tAGE\tCOMMAND")
			for _, se := range all {
				exit := ""
				if se.ExitCode != nil {
					exit = strconv.Itoa(*se.ExitCode)
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%v\t%v\t%d\t%s\t%s\n", se.ID, se.State, exit, se.TTY, se.Detachable, se.Attached,
					age(se.CreatedAt.Format(time.RFC3339)), strings.Join(se.Cmd, " "))
			}
			return w.Flush()
		},
	}
	var interactive bool
	var since int64
	attach := &cobra.Command{
		Use:   "attach SANDBOX SESSION [-i] [--since N]",
		Short: "Attach to a session: its output from the oldest byte it holds, and exit with its status",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var in io.Reader
			if interactive {
				in = stdin
			}
			from, quiet := since, false
			if from < 0 {
				// From byte 0, for offsets known at every byte (an
				// attachment ended by a snapshot is opened again from
				// where it was); what is no longer held is not a loss.
				from, quiet = 0, true
			}
			code, err := a.follow(cmd.Context(), c, args[0], args[1], from, "", in, -1, quiet)
			if err != nil {
				return err
			}
			return a.exitWith(code, 0)
		},
	}
	attach.Flags().BoolVarP(&interactive, "interactive", "i", false, "send standard input to the session")
	attach.Flags().Int64Var(&since, "since", -1, "output offset to start from (default: the oldest byte the session holds)")
	kill := &cobra.Command{
		Use:   "kill SANDBOX SESSION",
		Short: "End a session: SIGTERM to its processes, SIGKILL 5 s later",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.client()
			if err != nil {
				return err
			}
			var raw json.RawMessage
			se, err := c.KillSession(cmd.Context(), args[0], args[1], rawAnswer(&raw))
			if err != nil {
				return wrap(err)
			}
			if a.output == "json" {
				return a.writeJSON(raw)
			}
			fmt.Fprintf(a.stdout, "%s ending (%s)\n", se.ID, se.State)
			return nil
		},
	}
	cmd.AddCommand(list, attach, kill)
	return cmd
}
