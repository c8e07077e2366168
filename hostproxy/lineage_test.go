package hostproxy_test

import (
	"testing"
)

// TestSeedLineage replays the seed document's example through hostproxy:
// after A, B and C, restoring B and creating D gives D the parent B, and C
// stays restorable. Deleting B keeps D's parent_id and C restorable.
func TestSeedLineage(t *testing.T) {
	s := startStack(t, nil)
	a := s.create(keyA, "sb-a1", "/workspace/project", "A")
	b := s.create(keyA, "sb-a1", "/workspace/project", "B")
	c := s.create(keyA, "sb-a1", "/workspace/project", "C")
	if a.ParentID != "" || b.ParentID != a.ID || c.ParentID != b.ID {
		t.Fatalf("parents: A=%q B=%q C=%q", a.ParentID, b.ParentID, c.ParentID)
	}
	var restored struct {
		CheckpointID string `json:"checkpoint_id"`
		Path         string `json:"path"`
	}
	s.mustData(request{method: "POST", path: cpsA1 + "/" + b.ID + "/restore", key: keyA}, &restored)
	if restored.CheckpointID != b.ID || restored.Path != "/workspace/project" {
		t.Fatalf("restore answered %+v", restored)
	}
	d := s.create(keyA, "sb-a1", "/workspace/project", "D")
	if d.ParentID != b.ID {
		t.Errorf("D's parent %q, want B %q", d.ParentID, b.ID)
	}
	other := s.create(keyA, "sb-a1", "/home/user/app", "other dir")
	if other.ParentID != "" {
		t.Errorf("first capture of another directory has parent %q", other.ParentID)
	}

	var list []checkpoint
	s.mustData(request{method: "GET", path: cpsA1, key: keyA}, &list)
	want := []string{a.ID, b.ID, c.ID, d.ID, other.ID}
	if len(list) != len(want) {
		t.Fatalf("list has %d records, want %d", len(list), len(want))
	}
	for i, cp := range list {
		if cp.ID != want[i] {
			t.Errorf("list[%d] = %s, want %s (oldest first)", i, cp.ID, want[i])
		}
	}

	s.mustData(request{method: "DELETE", path: cpsA1 + "/" + b.ID, key: keyA}, nil)
	s.mustData(request{method: "POST", path: cpsA1 + "/" + c.ID + "/restore", key: keyA}, nil)
	s.mustData(request{method: "GET", path: cpsA1, key: keyA}, &list)
	if len(list) != 4 || list[2].ID != d.ID || list[2].ParentID != b.ID {
		t.Errorf("after deleting B: %+v", list)
	}
	// Other sandboxes saw none of it.
	s.mustData(request{method: "GET", path: "/v1/sandboxes/sb-a2/checkpoints", key: keyA}, &list)
	if len(list) != 0 {
		t.Errorf("sb-a2 has %d checkpoints", len(list))
	}
}
