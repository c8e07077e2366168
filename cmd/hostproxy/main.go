// Command hostproxy serves strata's public checkpoint API and forwards it
// to the guest daemons of the sandboxes. See docs/api.md.
//
//	hostproxy --config /etc/strata/hostproxy.json
//	hostproxy --listen 127.0.0.1:8080 --data /var/lib/strata/hostproxy \
//	    --key-env CREATEOS_API_KEY --sandbox sb-local=unix:///var/lib/strata/guestd.sock
package main

import (
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"strata/hostproxy"
	"strata/internal/logx"
	"strata/sandbox"
)

func main() {
	// QEMUs started from here outlive hostproxy: none may inherit a
	// descriptor hostproxy was given (make run's lock, a caller's pipe),
	// which Go's exec leaves open in the child unless it is close-on-exec.
	// hostproxy itself keeps them open.
	unix.CloseRange(3, math.MaxUint32, unix.CLOSE_RANGE_CLOEXEC)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal kills at once
	}()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "hostproxy:", err)
		}
		os.Exit(2)
	}
}

// sandboxFlags collects repeated --sandbox ID=GUEST values.
type sandboxFlags []hostproxy.SandboxConfig

func (f *sandboxFlags) String() string { return "" }

func (f *sandboxFlags) Set(v string) error {
	id, guest, ok := strings.Cut(v, "=")
	if !ok || id == "" || guest == "" {
		return fmt.Errorf("want ID=GUEST, such as sb-local=unix:///var/lib/strata/guestd.sock")
	}
	*f = append(*f, hostproxy.SandboxConfig{ID: id, Guest: guest, State: hostproxy.StateRunning})
	return nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer, getenv func(string) string) error {
	fs := flag.NewFlagSet("hostproxy", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var (
		configPath = fs.String("config", "", "JSON configuration `file` (see docs/api.md)")
		listen     = fs.String("listen", "", "TCP `address` of the API (overrides the config; default "+hostproxy.DefaultListen+")")
		publicURL  = fs.String("public-url", "", "the API's `URL` as processes in sandboxes reach it (default http:// and the listen address)")
		dataDir    = fs.String("data", "", "data `directory` of the registry (overrides the config)")
		account    = fs.String("account", "local", "`id` of the account that --key-env and --sandbox add to")
		keyEnv     = fs.String("key-env", "", "add the account API key held in this environment `variable`")
		newKey     = fs.Bool("print-new-key", false, "print a new random account API key and exit")
		vmDir      = fs.String("vms", "", "run microVM sandboxes, keeping their disks and sockets in this `directory` (needs --image)")
		image      = fs.String("image", "", "guest image `directory` of the microVM sandboxes (strata-image build prints it)")
		accel      = fs.String("accel", "", "accelerator of the microVM sandboxes: tcg or kvm (default: probe the host)")
		pool       = fs.Int("pool", 1, "with --vms: keep this many sandboxes of the default resources booted ahead, for creates to take")
		forksAhead = fs.Int("forks-ahead", 1, "with --vms: keep one fork made ahead for each of this many snapshots, the last forked, for the next fork to take")
		sandboxes  sandboxFlags
		logOpts    logx.Options
	)
	fs.Var(&sandboxes, "sandbox", "add a running sandbox as `ID=GUEST` (unix:///path.sock or tcp://host:port); repeatable")
	logOpts.AddFlags(fs, "debug logging (accepted as guestd does; hostproxy writes no debug lines yet)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	log, err := logx.New(stderr, "hostproxy", logOpts)
	if err != nil {
		return err
	}
	if *newKey {
		key, err := hostproxy.NewSecret(rand.Reader, hostproxy.KeyPrefix)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintln(stdout, key)
		return err
	}

	var cfg hostproxy.Config
	if *configPath != "" {
		c, err := hostproxy.LoadConfig(*configPath)
		if err != nil {
			return err
		}
		cfg = c
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	if cfg.Listen == "" {
		cfg.Listen = hostproxy.DefaultListen
	}
	if *dataDir != "" {
		cfg.DataDir = *dataDir
	}
	if *vmDir != "" || *image != "" {
		if *vmDir == "" || *image == "" {
			return errors.New("--vms and --image go together")
		}
		if *pool < 0 || *pool > sandbox.MaxPool {
			return fmt.Errorf("--pool %d: want 0 to %d", *pool, sandbox.MaxPool)
		}
		if *forksAhead < 0 || *forksAhead > sandbox.MaxForksAhead {
			return fmt.Errorf("--forks-ahead %d: want 0 to %d", *forksAhead, sandbox.MaxForksAhead)
		}
		// Over the configuration's vms, if it has them (make run's
		// CONFIG=path): the flags win, its other keys (egress, limits)
		// stay.
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		vms := cfg.VMs
		if vms == nil {
			vms = &hostproxy.VMsConfig{Pool: *pool, ForksAhead: *forksAhead}
		}
		vms.Dir, vms.Image = *vmDir, *image
		if *accel != "" {
			vms.Accel = *accel
		}
		// --pool and --forks-ahead, given or by their defaults, unless
		// the configuration sets them and the flag is not given.
		if set["pool"] || vms.Pool == 0 {
			vms.Pool = *pool
		}
		if set["forks-ahead"] || vms.ForksAhead == 0 {
			vms.ForksAhead = *forksAhead
		}
		cfg.VMs = vms
	}
	if *publicURL != "" {
		cfg.PublicURL = *publicURL
	}
	if *keyEnv != "" || len(sandboxes) > 0 {
		i := accountIndex(&cfg, *account)
		if *keyEnv != "" {
			cfg.Accounts[i].Keys = append(cfg.Accounts[i].Keys, hostproxy.KeyConfig{ID: "env-" + strings.ToLower(*keyEnv), Env: *keyEnv})
		}
		for _, sb := range sandboxes {
			sb.Account = *account
			cfg.Sandboxes = append(cfg.Sandboxes, sb)
		}
	}

	srv, err := hostproxy.New(ctx, hostproxy.Options{Config: cfg, Getenv: getenv, Logger: log})
	if err != nil {
		return err
	}
	defer srv.Close()
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	log.Info("listening", "url", "http://"+ln.Addr().String(), "data", cfg.DataDir, "sandboxes", len(cfg.Sandboxes))
	err = srv.Serve(ctx, ln)
	log.Info("stopped")
	return err
}

// accountIndex returns the index of account id in cfg, adding it if needed.
func accountIndex(cfg *hostproxy.Config, id string) int {
	for i, a := range cfg.Accounts {
		if a.ID == id {
			return i
		}
	}
	cfg.Accounts = append(cfg.Accounts, hostproxy.AccountConfig{ID: id})
	return len(cfg.Accounts) - 1
}
