package runtime

import (
	"os"
	"testing"
)

// Claims are host-wide: two claimers of one dir (two instances) never hold
// one index at once, and an index given up is taken again.
func TestSlotClaims(t *testing.T) {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	a, b := &slotClaims{dir: dir, base: DefaultUIDBase}, &slotClaims{dir: dir, base: DefaultUIDBase}
	first, err := a.claim()
	if err != nil {
		t.Fatal(err)
	}
	second, err := b.claim()
	if err != nil {
		t.Fatal(err)
	}
	if first.index == second.index {
		t.Fatalf("two instances hold slot %d at once", first.index)
	}
	if root, user := a.ids(second.index); root != DefaultUIDBase+2*second.index || user != root+1 {
		t.Errorf("ids(%d) = %d, %d", second.index, root, user)
	}
	first.release()
	again, err := b.claim()
	if err != nil {
		t.Fatal(err)
	}
	if again.index != first.index {
		t.Errorf("claim after release took slot %d, want the freed %d", again.index, first.index)
	}
	again.release()
	second.release()
}
