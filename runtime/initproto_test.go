package runtime

import (
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite initproto.h from initproto.go")

// The C side's definitions are rendered from initproto.go: the header that
// is checked in is the one the Go side would write.
func TestInitProtocol(t *testing.T) {
	want := protocolHeader()
	if *update {
		if err := os.WriteFile("initproto.h", []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile("initproto.h")
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("initproto.h differs from what initproto.go defines: run go test ./runtime -run TestInitProtocol -update\n got:\n%s\nwant:\n%s", got, want)
	}
	seen := map[string]bool{}
	for _, d := range protocol {
		if seen[d.name] {
			t.Errorf("%s is defined twice", d.name)
		}
		seen[d.name] = true
	}
}
