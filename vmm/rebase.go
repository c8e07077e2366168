package vmm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// RebaseDisk puts onto, a frozen layer that reads the same as the layers
// of drop over the node backing (a merge of them made outside QEMU), in
// their place in the running chain: the node above, whose backing is
// drop[0], is reopened over onto (QMP blockdev-reopen), then the dropped
// nodes (top first) and their descriptor sets go. The disk the guest sees
// never changes, and no block job runs.
//
// QEMU gets onto as StartDisk gets a frozen layer: one descriptor, opened
// read-only by the caller's process (onto is root's file), in a set named
// after its node, and a node opened read-only with backing as its backing
// (which drop's last layer keeps reading until it goes). The node above
// is reopened with the options it was made with (driver, node name, its
// file through its descriptor set, read-only unless it is the top): a
// reopen resets every option it is not given. When above is the top, its
// qcow2 header names onto.Path as its backing file afterwards, as
// StreamDisk's top names its base: tools reading the file alone see the
// chain the caller records. A frozen layer's header is never written.
//
// A failed reopen changes nothing (QEMU reopens in a transaction), and
// onto's node and descriptors are taken back. Once the reopen is done,
// RebaseDisk fails only with ErrNotDropped: QEMU reads onto, and some of
// the dropped layers' nodes or descriptors are left open until it ends.
func (m *qemuMachine) RebaseDisk(ctx context.Context, above string, onto Layer, backing string, drop []string) error {
	for _, n := range append([]string{above, onto.Node, backing}, drop...) {
		if !ValidNode(n) {
			return fmt.Errorf("rebase of %s: node name %q is not valid", m.cfg.Name, n)
		}
	}
	if len(drop) == 0 {
		return fmt.Errorf("rebase of %s: no layer to replace", m.cfg.Name)
	}
	q, err := m.monitor(ctx)
	if err != nil {
		return err
	}
	top, err := m.top(ctx)
	if err != nil {
		return err
	}
	// The node above is spelled with its file's descriptor set: the set
	// carries the node's name (opaque), as StreamDisk finds the sets of
	// the layers it drops.
	sets, err := m.fdSets(ctx, q)
	if err != nil {
		return fmt.Errorf("rebase of %s: %w", m.cfg.Name, err)
	}
	set, ok := sets[above]
	if !ok {
		return fmt.Errorf("rebase of %s: no descriptor set names node %s", m.cfg.Name, above)
	}
	added, err := m.addFrozenLayer(ctx, q, onto, backing)
	if err != nil {
		return fmt.Errorf("rebase of %s: adding %s: %w", m.cfg.Name, onto.Node, err)
	}
	readOnly := above != top
	if _, err := q.Execute(ctx, "blockdev-reopen", map[string]any{"options": []any{map[string]any{
		"driver": "qcow2", "node-name": above, "read-only": readOnly,
		"file":    fileNode(set, readOnly),
		"backing": onto.Node,
	}}}); err != nil {
		m.dropLayer(q, added)
		return fmt.Errorf("rebase of %s: reopening %s over %s: %w", m.cfg.Name, above, onto.Node, err)
	}
	var errs []error
	if !readOnly {
		// Only the name in the top's header: QEMU reads the chain it
		// was given, whatever the header says.
		if _, err := q.Execute(ctx, "change-backing-file", map[string]any{
			"device": top, "image-node-name": top, "backing-file": onto.Path,
		}); err != nil {
			errs = append(errs, fmt.Errorf("naming %s in the top's header: %w", onto.Path, err))
		}
	}
	if err := m.dropNodes(ctx, q, sets, drop); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("rebase of %s: %w: %w", m.cfg.Name, ErrNotDropped, errors.Join(errs...))
	}
	return nil
}

// addFrozenLayer hands QEMU a frozen layer's file, read-only alone, in a
// descriptor set named after its node, and adds it as a read-only block
// node over the node backing. It returns what dropLayer takes back.
func (m *qemuMachine) addFrozenLayer(ctx context.Context, q *QMP, l Layer, backing string) (string, error) {
	if !ValidNode(l.Node) {
		return "", fmt.Errorf("layer node name %q is not valid", l.Node)
	}
	f, err := os.OpenFile(l.Path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("disk layer: %w", err)
	}
	defer f.Close()
	set, err := addFDSet(ctx, q, l.Node, []*os.File{f})
	if err != nil {
		return "", err
	}
	if _, err := q.Execute(ctx, "blockdev-add", map[string]any{
		"driver": "qcow2", "node-name": l.Node, "read-only": true,
		"file":    fileNode(set, true),
		"backing": backing,
	}); err != nil {
		q.cleanup("remove-fd", map[string]any{"fdset-id": set})
		return "", err
	}
	return l.Node + "\x00" + fmt.Sprint(set), nil
}

// dropNodes deletes the nodes of layers no longer in the chain (top
// first: a node made with blockdev-add goes once nothing above it holds
// it; one made with -blockdev went with its parent's link already) and
// removes their descriptor sets (sets: node → set), which closes the
// descriptors QEMU was given for them. The chain has changed already: a
// cancelled ctx does not cut the drops short.
func (m *qemuMachine) dropNodes(ctx context.Context, q *QMP, sets map[string]int, drop []string) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	var errs []error
	for _, node := range drop {
		if _, err := q.Execute(dctx, "blockdev-del", map[string]any{"node-name": node}); err != nil && !notFound(err) {
			errs = append(errs, fmt.Errorf("dropping %s: %w", node, err))
			continue
		}
		if set, ok := sets[node]; ok {
			if _, err := q.Execute(dctx, "remove-fd", map[string]any{"fdset-id": set}); err != nil && !notFound(err) {
				errs = append(errs, fmt.Errorf("closing the descriptors of %s: %w", node, err))
			}
		}
	}
	return errors.Join(errs...)
}
