// Command strata-init is PID 1 of a strata microVM: /init in the
// initramfs, then the supervisor of guestd. See package guestinit.
package main

import "strata/guestinit"

func main() { guestinit.Main() }
