package guestinit

import (
	"fmt"
	"strings"
)

// DefaultHostname is the guest's hostname when the kernel command line
// sets none (or an invalid one).
const DefaultHostname = "sandbox"

// DefaultRoot is the root disk when strata.root= is not given.
const DefaultRoot = "/dev/vda"

// Check is what strata.check= asks for.
type Check int

const (
	// CheckNone: the usual boot.
	CheckNone Check = iota
	// CheckRun runs sh, git and python3 once and prints their answers.
	CheckRun
	// CheckShutdown runs the checks, then shuts the guest down cleanly.
	CheckShutdown
)

// Params are the kernel command-line parameters strata-init reads.
type Params struct {
	Hostname string
	Root     string
	Check    Check
	// Warnings name the parameters that were ignored, and why.
	Warnings []string
}

// ParseCmdline reads the parameters strata-init understands from a kernel
// command line (the text of /proc/cmdline). Words are separated by
// whitespace; double quotes group (and are removed), as the kernel's own
// parser does; the last occurrence of a parameter wins. Unknown parameters
// are ignored, invalid values fall back to the default with a warning.
func ParseCmdline(cmdline string) Params {
	p := Params{Hostname: DefaultHostname, Root: DefaultRoot}
	for _, word := range splitCmdline(cmdline) {
		key, value, _ := strings.Cut(word, "=")
		switch key {
		case "strata.hostname":
			if err := validHostname(value); err != nil {
				p.Warnings = append(p.Warnings, fmt.Sprintf("strata.hostname=%q ignored: %v", value, err))
				p.Hostname = DefaultHostname
				continue
			}
			p.Hostname = value
		case "strata.root":
			if !strings.HasPrefix(value, "/dev/") || strings.Contains(value, "..") || len(value) <= len("/dev/") {
				p.Warnings = append(p.Warnings, fmt.Sprintf("strata.root=%q ignored: not a /dev/ path", value))
				p.Root = DefaultRoot
				continue
			}
			p.Root = value
		case "strata.check":
			switch value {
			case "", "0":
				p.Check = CheckNone
			case "1":
				p.Check = CheckRun
			case "shutdown":
				p.Check = CheckShutdown
			default:
				p.Warnings = append(p.Warnings, fmt.Sprintf("strata.check=%q ignored: want 1 or shutdown", value))
			}
		}
	}
	return p
}

// splitCmdline splits a kernel command line into words: whitespace
// separates, a double quote toggles quoting and is dropped.
func splitCmdline(s string) []string {
	var words []string
	var b strings.Builder
	in, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			in = true
		case !quoted && (r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == 0):
			if in {
				words = append(words, b.String())
				b.Reset()
				in = false
			}
		default:
			b.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, b.String())
	}
	return words
}

// validHostname accepts what sethostname(2) and resolvers agree on: 1 to
// 63 bytes of letters, digits, '-' and '.', not starting or ending with
// '-' or '.'.
func validHostname(h string) error {
	if h == "" {
		return fmt.Errorf("empty")
	}
	if len(h) > 63 {
		return fmt.Errorf("longer than 63 bytes")
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.'
		if !ok {
			return fmt.Errorf("byte %q is not a letter, digit, '-' or '.'", c)
		}
	}
	if h[0] == '-' || h[0] == '.' || h[len(h)-1] == '-' || h[len(h)-1] == '.' {
		return fmt.Errorf("starts or ends with '-' or '.'")
	}
	return nil
}
