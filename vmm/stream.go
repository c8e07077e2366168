package vmm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// streamJob is the id of the block job StreamDisk runs (one at a time per
// machine: its caller holds the sandbox).
const streamJob = "compact"

// StreamDisk merges into the disk's top every layer between the top and
// base (a layer of the running chain: QMP block-stream with base-node),
// then drops the merged layers' nodes and descriptor sets. The top's
// qcow2 header names base.Path as its backing file afterwards, so that
// tools reading the file alone see the chain the caller records.
//
// Only the top is written, and only with data its backing layers already
// give it: the disk the guest sees never changes, whether the job
// completes, fails or is cancelled (ctx). A cancelled or failed job
// leaves the chain as it was; the layers it did not drop are still read.
// A machine started with Incoming cannot stream before its state is
// loaded: its images are inactive and QEMU refuses the job ("Inactive
// ... can't be a file child of active ..."); in prelaunch otherwise (-S,
// images active) the job runs to its end (QEMU 10.0.2, TestRebaseDisk).
func (m *qemuMachine) StreamDisk(ctx context.Context, base Layer, drop []string) error {
	if !ValidNode(base.Node) {
		return fmt.Errorf("stream base node %q is not valid", base.Node)
	}
	q, err := m.monitor(ctx)
	if err != nil {
		return err
	}
	top, err := m.top(ctx)
	if err != nil {
		return err
	}
	// Without the sets (a reply too long, say) the merged layers'
	// descriptors stay open until QEMU ends: the stream is still worth it.
	sets, _ := m.fdSets(ctx, q)
	// No blockdev-reopen first: with one, the job stayed paused forever
	// (QEMU 10.0.2). block-stream reopens the top itself.
	if _, err := q.Execute(ctx, "block-stream", map[string]any{
		"job-id": streamJob, "device": top, "base-node": base.Node,
		"backing-file": base.Path, "auto-dismiss": false,
	}); err != nil {
		return err
	}
	if err := m.waitJob(ctx, q); err != nil {
		return err
	}
	if err := m.dropNodes(ctx, q, sets, drop); err != nil {
		return fmt.Errorf("stream of %s: %w: %w", m.cfg.Name, ErrNotDropped, err)
	}
	return nil
}

// ErrNotDropped is StreamDisk's or RebaseDisk's error when the chain has
// changed (the stream completed, the reopen was done: nothing reads the
// dropped layers any more) but QEMU kept some of their nodes or
// descriptors open.
var ErrNotDropped = errors.New("merged layers not all dropped")

// waitJob waits for the stream job to conclude and dismisses it. A
// cancelled ctx cancels the job first (bounded: a job that does not end
// within 10 s is left to QEMU's exit).
func (m *qemuMachine) waitJob(ctx context.Context, q *QMP) error {
	for {
		job, err := m.job(ctx, q)
		if err != nil {
			return m.cancelJob(q, err)
		}
		switch {
		case job == nil:
			return fmt.Errorf("stream of %s: job %s vanished", m.cfg.Name, streamJob)
		case job.Status == "concluded":
			q.Execute(ctx, "job-dismiss", map[string]any{"id": streamJob})
			if job.Error != "" {
				return fmt.Errorf("stream of %s: %s", m.cfg.Name, job.Error)
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return m.cancelJob(q, ctx.Err())
		case <-m.done:
			return fmt.Errorf("qemu of %s exited while streaming its disk", m.cfg.Name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// cancelJob cancels the stream job and waits (bounded) for its end, so
// that the caller's next block operation finds no job; it returns cause.
func (m *qemuMachine) cancelJob(q *QMP, cause error) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q.Execute(ctx, "block-job-cancel", map[string]any{"device": streamJob, "force": true})
	for ctx.Err() == nil {
		job, err := m.job(ctx, q)
		if err != nil || job == nil {
			break
		}
		if job.Status == "concluded" {
			q.Execute(ctx, "job-dismiss", map[string]any{"id": streamJob})
			break
		}
		select {
		case <-ctx.Done():
		case <-m.done:
			return cause
		case <-time.After(10 * time.Millisecond):
		}
	}
	return cause
}

type blockJob struct {
	Device string `json:"device"`
	Status string `json:"status"`
	Error  string `json:"error"`
}

// job is the stream job as QEMU reports it, nil when there is none.
func (m *qemuMachine) job(ctx context.Context, q *QMP) (*blockJob, error) {
	ret, err := q.Execute(ctx, "query-block-jobs", nil)
	if err != nil {
		return nil, err
	}
	var jobs []blockJob
	if err := json.Unmarshal(ret, &jobs); err != nil {
		return nil, fmt.Errorf("query-block-jobs: %w", err)
	}
	for _, j := range jobs {
		if j.Device == streamJob {
			return &j, nil
		}
	}
	return nil, nil
}

// fdSets maps the disk's layer nodes to their descriptor sets, by the
// node name each set carries (opaque, given with -add-fd and add-fd).
// Not query-named-block-nodes: its answer grows with the square of the
// chain's length (each node describes the chain under it), past the
// monitor's line limit at about 60 layers.
func (m *qemuMachine) fdSets(ctx context.Context, q *QMP) (map[string]int, error) {
	ret, err := q.Execute(ctx, "query-fdsets", nil)
	if err != nil {
		return nil, err
	}
	return parseFDSets(ret)
}

// parseFDSets reads query-fdsets' answer into node → set: a set's fds
// must all name the same node (a set without a name is skipped).
func parseFDSets(ret []byte) (map[string]int, error) {
	var fdsets []struct {
		ID  int `json:"fdset-id"`
		FDs []struct {
			Opaque string `json:"opaque"`
		} `json:"fds"`
	}
	if err := json.Unmarshal(ret, &fdsets); err != nil {
		return nil, fmt.Errorf("query-fdsets: %w", err)
	}
	sets := map[string]int{}
	for _, set := range fdsets {
		node := ""
		for i, fd := range set.FDs {
			if i == 0 {
				node = fd.Opaque
			} else if fd.Opaque != node {
				node = ""
				break
			}
		}
		if ValidNode(node) {
			sets[node] = set.ID
		}
	}
	return sets, nil
}

// notFound tells whether QEMU answered that a node or set is not there
// (a node made with -blockdev goes with its parent's link).
func notFound(err error) bool {
	var qe *QMPError
	return errors.As(err, &qe) && (strings.Contains(qe.Desc, "Failed to find") || strings.Contains(qe.Desc, "not found") || strings.Contains(qe.Desc, "No such"))
}
