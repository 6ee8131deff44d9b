package runtime

import (
	"encoding/binary"
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

// A T frame names what was left out of outputs/; a bare or malformed one
// names nothing (the call's files_truncated still says something was).
func TestDecodeLeftOut(t *testing.T) {
	frame := func(why byte, size uint64, path string) []byte {
		return append(binary.BigEndian.AppendUint64([]byte{why}, size), path...)
	}
	for _, tc := range []struct {
		name    string
		payload []byte
		want    LeftOut
		named   bool
	}{
		{"bare", nil, LeftOut{}, false},
		{"bytes", frame(leftBytes, 16<<20, "fig.png"), LeftOut{Path: "fig.png", Size: 16 << 20, Why: LeftBytes}, true},
		{"a dir past the walk", frame(leftLimits, 0, "deep/d/"), LeftOut{Path: "deep/d/", Why: LeftLimits}, true},
		{"invalid UTF-8 path", frame(leftCount, 1, "a\xffb"), LeftOut{Path: "a\uFFFDb", Size: 1, Why: LeftCount}, true},
		{"unknown reason", frame(9, 1, "x"), LeftOut{}, false},
		{"size past int64", frame(leftBytes, 1<<63, "x"), LeftOut{}, false},
		{"short", []byte{leftBytes, 0, 0}, LeftOut{}, false},
	} {
		got, named := decodeLeftOut(tc.payload)
		if got != tc.want || named != tc.named {
			t.Errorf("decodeLeftOut(%s) = %+v, %v; want %+v, %v", tc.name, got, named, tc.want, tc.named)
		}
	}
}
