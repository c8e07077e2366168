package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

var vmPoolOnly = flag.Bool("vm-pool-only", false, "measure only creates that take a pooled sandbox")

// poolRows restarts hostproxy with a pool of one sandbox and times five
// creates of the default resources, each once the pool has its sandbox
// running again: create to running, and to a first exec answered.
func (b *vmBench) poolRows(bin string) ([]row, error) {
	b.proxy.Process.Signal(syscall.SIGTERM)
	b.proxy.Wait()
	if err := b.startWith(bin, 1); err != nil {
		return nil, err
	}
	var boots, toExec []time.Duration
	for i := range 5 {
		fmt.Fprintf(os.Stderr, "create %d of 5 from the pool…\n", i+1)
		if err := b.waitPoolReady(4 * time.Minute); err != nil {
			return nil, err
		}
		id, boot, exec, err := b.create()
		if err != nil {
			return nil, err
		}
		boots, toExec = append(boots, boot), append(toExec, exec)
		if _, err := b.call("DELETE", "/v1/sandboxes/"+id, ""); err != nil {
			return nil, err
		}
	}
	return []row{
		{"create to running, taking a pooled sandbox", dur(median(boots)), dur(p99(boots)), "5 creates through the API, each once the pool (vms.pool 1) had its next sandbox running: the guest's hostname, clock and RNG through the channel, one transaction", "", "≤ 2.5 s"},
		{"… to its first exec answered", dur(median(toExec)), dur(p99(toExec)), "the same creates", "", ""},
	}, nil
}

// waitPoolReady waits for hostproxy's metrics to say a pooled sandbox runs.
func (b *vmBench) waitPoolReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		req, err := http.NewRequest(http.MethodGet, b.url+"/metrics", nil)
		if err != nil {
			return err
		}
		req.Header.Set("X-Api-Key", b.key) // the metrics are an account key's
		resp, err := b.client.Do(req)
		if err != nil {
			return err
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(body), "\n") {
			if v, ok := strings.CutPrefix(line, "strata_hostproxy_pool_ready "); ok {
				if n, _ := strconv.ParseFloat(v, 64); n >= 1 {
					return nil
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("no pooled sandbox running after %v", timeout)
}
