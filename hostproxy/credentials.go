package hostproxy

import (
	"context"
	"sync"

	"strata/internal/api"
)

// Credentials of microVM sandboxes: the guest's env file (guestd's PUT
// /v1/credentials) is how processes inside find the API address, their
// sandbox id and the sandbox's access token. The registry keeps only the
// token's hash, and a guest can take credentials only while it runs, so a
// token issued or rotated while its sandbox is creating, paused or stopped
// is kept in plain text, in memory only, as owed to that guest until it
// can be handed over: by booted, after each boot, or by the first request
// that finds the sandbox running (a resume, or a delivery that failed).
// A revoke clears it. A hostproxy restarted in between has lost it: the
// guest then keeps its own copy of the token only if it is still the
// sandbox's token (api.Credentials.TokenSHA256), and otherwise has none
// until the next rotate. A change of the sandbox's access setting
// (access.go) owes the guest its credentials again, the same way.
//
// What a guest is handed follows its access setting, read from its record
// at each delivery: with "none", no key at all (neither the channel key
// nor a token: a token owed then is dropped, its issuer has it), so that
// a revoke never brings back a channel key the setting took away.
//
// Race: the decisions of what to send and the sends themselves are made
// one at a time per guest (owed.sending), so two deliveries never reach a
// guest in the other order than they were decided in.

// owedTokens are the access tokens owed to microVM guests, by guest
// address.
type owedTokens struct {
	mu sync.Mutex
	m  map[string]*owed
}

// owed is what one guest is owed.
type owed struct {
	// sending is held while credentials are chosen and sent to the guest.
	sending sync.Mutex

	mu    sync.Mutex
	token string // plaintext; "" when no token is owed
	// refresh owes the guest its credentials again (its access setting
	// changed, or a delivery failed), with or without a token.
	refresh bool
	gen     uint64 // counts the changes of token and refresh
}

// entry returns guest's entry, made on first use.
func (o *owedTokens) entry(guest string) *owed {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.m == nil {
		o.m = map[string]*owed{}
	}
	e := o.m[guest]
	if e == nil {
		e = &owed{}
		o.m[guest] = e
	}
	return e
}

// set owes token to guest in place of what it was owed; "" owes nothing.
func (o *owedTokens) set(guest, token string) {
	e := o.entry(guest)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.token = token
	e.gen++
}

// touch owes guest its credentials again, whatever token it is owed.
func (o *owedTokens) touch(guest string) {
	e := o.entry(guest)
	e.mu.Lock()
	defer e.mu.Unlock()
	e.refresh = true
	e.gen++
}

// has tells whether guest is owed a token or its credentials.
func (o *owedTokens) has(guest string) bool {
	o.mu.Lock()
	e := o.m[guest]
	o.mu.Unlock()
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.token != "" || e.refresh
}

// forget drops what guest is owed (its sandbox is deleted).
func (o *owedTokens) forget(guest string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.m, guest)
}

// take returns the token owed ("" for none), whether anything was owed
// (a token, or the credentials again), and forgets it; gen is for
// giveBack.
func (e *owed) take() (token string, due bool, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	token, due, gen = e.token, e.token != "" || e.refresh, e.gen
	if due {
		e.token, e.refresh = "", false
		e.gen++
		gen = e.gen
	}
	return token, due, gen
}

// giveBack owes token (and the credentials) again after a failed
// delivery, unless something else was owed (a rotate) or cleared (a
// revoke) since take.
func (e *owed) giveBack(token string, gen uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.gen == gen {
		e.token, e.refresh = token, true
		e.gen++
	}
}

// booted hands a freshly booted microVM guest its credentials
// (sendCredentials): the manager calls it after each boot.
func (s *Server) booted(ctx context.Context, sb Sandbox) error {
	return s.sendCredentials(ctx, sb.ID, false)
}

// sendCredentials puts the credentials of microVM sandbox id to its guest:
// the API address through the channel, the id, and, unless its access
// setting is none, its channel key (channelkey.go) and the token owed to
// the guest; with none owed, the SHA-256 of the sandbox's current token
// if it has one, for the guest to keep its copy only if it is that token.
// With onlyOwed it does nothing unless something is owed, or while
// another delivery to the guest is under way (that one, or the next
// request that finds the sandbox running, hands it over). What could not
// be delivered stays owed.
func (s *Server) sendCredentials(ctx context.Context, id string, onlyOwed bool) error {
	guest := guestAddress(id)
	e := s.owed.entry(guest)
	if onlyOwed {
		if !e.sending.TryLock() {
			return nil
		}
	} else {
		e.sending.Lock()
	}
	defer e.sending.Unlock()
	token, due, gen := e.take()
	if !due && onlyOwed {
		return nil
	}
	err := s.putCredentials(ctx, id, token)
	if err != nil && due {
		e.giveBack(token, gen)
	}
	return err
}

// putCredentials is sendCredentials's delivery, of token ("" for none).
func (s *Server) putCredentials(ctx context.Context, id, token string) error {
	sb, err := s.reg.Sandbox(ctx, id)
	if err != nil {
		return err
	}
	c := api.Credentials{APIURL: api.GuestAPIURL, SandboxID: id}
	if !accessOf(sb).None {
		c.Token, c.ChannelKey = token, s.reg.ChannelKey(id)
		if token == "" {
			if c.TokenSHA256, err = s.reg.tokenHash(ctx, id); err != nil {
				return err
			}
		}
	}
	return s.guests.PutCredentials(ctx, guestAddress(id), c)
}

// deliverOwed starts handing a running microVM sandbox's guest what it is
// owed (a token, its credentials again), if anything, in the background:
// the request that found the sandbox running does not wait for it.
func (s *Server) deliverOwed(sb Sandbox) {
	if sb.Machine == nil || sb.State != StateRunning || !s.owed.has(guestAddress(sb.ID)) {
		return
	}
	go func() {
		if err := s.sendCredentials(s.ctx, sb.ID, true); err != nil {
			s.log.Warn("owed credentials not delivered to the guest; the next request that finds the sandbox running retries", "sandbox", sb.ID, "err", err)
		}
	}()
}
