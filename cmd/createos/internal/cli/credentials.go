package cli

import "strata/client"

// environment is where createos finds what its flags do not give: the
// process's environment first, then the env file guestd writes inside a
// sandbox (root-readable) for the variables the environment lacks. The
// file is $CREATEOS_CREDENTIALS, or DefaultCredentials when that is unset,
// so that a test (or anyone) can point it elsewhere; a file that is missing
// or unreadable changes nothing.
//
// It remembers which values came from the file, so that an error can say
// so: a key left in the file by an earlier run must not fail as though it
// were the one the user typed.
type environment struct {
	getenv func(string) string
	// File is the path of the credentials file.
	File string

	values   map[string]string // the file's, read on first use
	fromFile map[string]bool   // names whose value get took from the file
}

func newEnvironment(getenv func(string) string) *environment {
	file := getenv(EnvCredentials)
	if file == "" {
		file = DefaultCredentials
	}
	return &environment{getenv: getenv, File: file, fromFile: map[string]bool{}}
}

// get returns name's value from the environment, else from the file.
func (e *environment) get(name string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	if e.values == nil {
		e.values = client.ReadCredentials(e.File)
	}
	v := e.values[name]
	if v != "" {
		e.fromFile[name] = true
	}
	return v
}

// inFile reports whether name's value came from the file.
func (e *environment) inFile(name string) bool { return e.fromFile[name] }
