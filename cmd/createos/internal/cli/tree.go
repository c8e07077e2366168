package cli

import (
	"fmt"
	"io"
	"sort"
	"strings"
)

// The lineage of checkpoints, as the tree command draws it.
//
// Records come from the list endpoint, oldest first; parent_id links a
// capture to the checkpoint its directory continued from. Per directory
// that gives a forest: a root is a first capture, or a checkpoint whose
// parent was deleted. A restore shows as a branch: the next capture's
// parent is the restored checkpoint, which then has several children.
//
// The live mark: each directory continues from the checkpoint its next
// capture will name as parent_id, the one last captured or restored. The
// server says which (GET …/directories, an extension); a server without it
// leaves createos to guess from the list: the newest checkpoint of each
// directory, exact until a restore. When the checkpoint a directory
// continues from was deleted, no node is marked.

// TreeNode is a checkpoint with its children, newest first.
type TreeNode struct {
	Checkpoint
	// Live marks the checkpoint the directory continues from (see above).
	Live bool `json:"live,omitempty"`
	// ParentDeleted is set on a root whose parent_id names a checkpoint
	// that is no longer listed.
	ParentDeleted bool        `json:"parent_deleted,omitempty"`
	Children      []*TreeNode `json:"children"`

	index  int  // position in the list: a larger index is newer
	newest int  // the largest index in this subtree
	root   bool // drawn without a parent below it
}

// Lineage is the tree of one directory.
type Lineage struct {
	Path string `json:"path"`
	// LiveID is the checkpoint marked live ("" when it was deleted).
	LiveID string      `json:"live_id"`
	Roots  []*TreeNode `json:"roots"`

	newest int
}

// BuildLineage groups list (oldest first) by directory and links each
// record to its parent. Directories come newest activity first; children
// and roots newest subtree first. live maps a directory to the checkpoint
// it continues from; nil means unknown (mark the newest).
func BuildLineage(list []Checkpoint, live map[string]string) []*Lineage {
	byPath := map[string]*Lineage{}
	nodes := map[string]*TreeNode{}
	var order []*Lineage
	for i, cp := range list {
		n := &TreeNode{Checkpoint: cp, index: i, newest: i, Children: []*TreeNode{}}
		nodes[cp.ID] = n
		l := byPath[cp.Path]
		if l == nil {
			l = &Lineage{Path: cp.Path}
			byPath[cp.Path] = l
			order = append(order, l)
		}
		l.newest = i
		l.LiveID = cp.ID
	}
	for _, cp := range list {
		n := nodes[cp.ID]
		parent := nodes[cp.ParentID]
		if parent != nil && parent.Path == cp.Path && parent.index < n.index {
			parent.Children = append(parent.Children, n)
			continue
		}
		n.ParentDeleted = cp.ParentID != ""
		n.root = true
		l := byPath[cp.Path]
		l.Roots = append(l.Roots, n)
	}
	for _, l := range order {
		for _, r := range l.Roots {
			settle(r)
		}
		sortNewestFirst(l.Roots)
		if live != nil {
			l.LiveID = ""
			if n := nodes[live[l.Path]]; n != nil && n.Path == l.Path {
				l.LiveID = n.ID
			}
		}
		if n := nodes[l.LiveID]; n != nil {
			n.Live = true
		}
	}
	sort.SliceStable(order, func(i, j int) bool { return order[i].newest > order[j].newest })
	return order
}

// settle computes each subtree's newest index and sorts children by it.
func settle(n *TreeNode) int {
	for _, c := range n.Children {
		if m := settle(c); m > n.newest {
			n.newest = m
		}
	}
	sortNewestFirst(n.Children)
	return n.newest
}

func sortNewestFirst(ns []*TreeNode) {
	sort.SliceStable(ns, func(i, j int) bool { return ns[i].newest > ns[j].newest })
}

// graphRow is one line of the drawing: either a checkpoint or a line that
// joins a branch back into its parent's lane.
type graphRow struct {
	graph string
	node  *TreeNode
}

// drawLineage lays a directory's forest out newest first, as git log
// --graph does: every checkpoint is printed after all of its descendants,
// each branch contiguous, so the lanes that meet at a checkpoint are
// always the rightmost ones and never cross.
func drawLineage(l *Lineage) []graphRow {
	var rows []graphRow
	var lanes []string // the id each open lane leads down to
	lane := func(n int, star int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(' ')
			}
			if i == star {
				b.WriteByte('*')
			} else {
				b.WriteByte('|')
			}
		}
		return b.String()
	}
	var emit func(n *TreeNode)
	emit = func(n *TreeNode) {
		for _, c := range n.Children {
			emit(c)
		}
		// The lanes waiting for n are the last len(n.Children) ones; join
		// them into the leftmost, one at a time.
		k := len(n.Children)
		if k == 0 {
			lanes = append(lanes, n.ID)
		}
		for ; k > 1; k-- {
			j := len(lanes) - 1
			rows = append(rows, graphRow{graph: lane(j, -1) + "/"})
			lanes = lanes[:j]
		}
		col := len(lanes) - 1
		rows = append(rows, graphRow{graph: lane(len(lanes), col), node: n})
		// n's lane goes on down to its parent, or ends at a root.
		lanes[col] = n.ParentID
		if n.root {
			lanes = lanes[:col]
		}
	}
	for _, r := range l.Roots {
		emit(r)
	}
	return rows
}

// writeTree prints every directory's lineage for people.
func writeTree(w io.Writer, lineages []*Lineage) error {
	if len(lineages) == 0 {
		_, err := fmt.Fprintln(w, "No checkpoints.")
		return err
	}
	for i, l := range lineages {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintln(w, l.Path)
		rows := drawLineage(l)
		width := 0
		for _, r := range rows {
			width = max(width, len(r.graph))
		}
		for _, r := range rows {
			if r.node == nil {
				fmt.Fprintln(w, r.graph)
				continue
			}
			n := r.node
			line := fmt.Sprintf("%-*s  %s  %s  %10s", width, r.graph, n.ID, n.CreatedAt, humanSize(n.SizeBytes))
			if n.Auto {
				line += "  " + autoMark
			}
			if n.Name != "" {
				line += "  " + quoteName(n.Name)
			}
			if n.Live {
				line += "  <- live"
			}
			if n.ParentDeleted {
				line += "  (parent " + n.ParentID + " deleted)"
			}
			if _, err := fmt.Fprintln(w, line); err != nil {
				return err
			}
		}
	}
	return nil
}

// quoteName shows a name as is unless it has spaces at its ends or is
// empty, where quotes make it visible.
func quoteName(s string) string {
	if s == "" || strings.TrimSpace(s) != s {
		return fmt.Sprintf("%q", s)
	}
	return s
}
