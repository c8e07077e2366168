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

	"strata/internal/api"
)

// stdin is what -i forwards; a terminal here (-t) is put in raw mode.
var stdin io.Reader = os.Stdin

// stream copies an attachment here until the session's exit (its code:
// -1 when its timeout killed it) or the attachment's end. With in, stdin
// goes to the session (its end as "eof"); with fd a terminal (-t), it is
// put in raw mode and its size follows this one's.
func (a *app) stream(ctx context.Context, conn *websocket.Conn, in io.Reader, ttyFd int) (int, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	send := func(m api.SessionControl) error {
		b, _ := json.Marshal(m)
		return conn.Write(ctx, websocket.MessageText, b)
	}
	if ttyFd >= 0 {
		old, err := term.MakeRaw(ttyFd)
		if err == nil {
			defer term.Restore(ttyFd, old)
		}
		resize := func() {
			if cols, rows, err := term.GetSize(ttyFd); err == nil {
				send(api.SessionControl{Type: "resize", Rows: rows, Cols: cols})
			}
		}
		winch := make(chan os.Signal, 1)
		signal.Notify(winch, syscall.SIGWINCH)
		defer signal.Stop(winch)
		go func() {
			for {
				select {
				case <-winch:
					resize()
				case <-ctx.Done():
					return
				}
			}
		}()
		resize()
	}
	var writing sync.WaitGroup
	if in != nil {
		writing.Add(1)
		go func() {
			defer writing.Done()
			buf := make([]byte, 32<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if conn.Write(ctx, websocket.MessageBinary, append([]byte{api.StreamStdin}, buf[:n]...)) != nil {
						return
					}
				}
				if err != nil {
					if errors.Is(err, io.EOF) {
						send(api.SessionControl{Type: "eof"})
					}
					return
				}
			}
		}()
	}
	for {
		typ, b, err := conn.Read(ctx)
		if err != nil {
			st := websocket.CloseStatus(err)
			var ce websocket.CloseError
			errors.As(err, &ce)
			switch {
			case st == websocket.StatusNormalClosure:
				return 0, errors.New("the attachment closed before the command's exit")
			case st != -1:
				return 0, fmt.Errorf("the attachment was ended (%d): %s", st, ce.Reason)
			}
			return 0, fmt.Errorf("the attachment broke: %w", err)
		}
		if typ == websocket.MessageBinary {
			if len(b) == 0 {
				continue
			}
			w := a.stdout
			if b[0] == api.StreamStderr {
				w = a.stderr
			}
			if _, err := w.Write(b[1:]); err != nil {
				return 0, err
			}
			continue
		}
		var m api.SessionControl
		if json.Unmarshal(b, &m) != nil {
			continue
		}
		switch m.Type {
		case "dropped":
			fmt.Fprintf(a.stderr, "createos: %d bytes of output were no longer held for this attachment\n", m.Bytes)
		case "exit":
			conn.Close(websocket.StatusNormalClosure, "")
			if m.ExitCode == nil {
				return 1, nil
			}
			return *m.ExitCode, nil
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
	se, _, err := c.StartSession(ctx, sandbox, req)
	if err != nil {
		return wrap(err)
	}
	conn, err := c.Attach(ctx, sandbox, se.ID, 0)
	if err != nil {
		return wrap(err)
	}
	defer conn.CloseNow()
	var in io.Reader
	if interactive {
		in = stdin
	} else {
		// Without -i the command's stdin is empty, as a one-shot exec's:
		// it ends at once.
		b, _ := json.Marshal(api.SessionControl{Type: "eof"})
		if err := conn.Write(ctx, websocket.MessageText, b); err != nil {
			return &callError{err}
		}
	}
	code, err := a.stream(ctx, conn, in, ttyFd)
	if err != nil {
		return &callError{err}
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
			all, raw, err := c.ListSessions(cmd.Context(), args[0])
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
			conn, err := c.Attach(cmd.Context(), args[0], args[1], since)
			if err != nil {
				return wrap(err)
			}
			defer conn.CloseNow()
			var in io.Reader
			if interactive {
				in = stdin
			}
			code, err := a.stream(cmd.Context(), conn, in, -1)
			if err != nil {
				return &callError{err}
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
			se, raw, err := c.KillSession(cmd.Context(), args[0], args[1])
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
