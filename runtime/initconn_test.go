package runtime

import (
	"encoding/binary"
	"testing"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

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
		{"bytes", frame(initproto.LeftBytes, 16<<20, "fig.png"), LeftOut{Path: "fig.png", Size: 16 << 20, Why: LeftBytes}, true},
		{"a dir past the walk", frame(initproto.LeftLimits, 0, "deep/d/"), LeftOut{Path: "deep/d/", Why: LeftLimits}, true},
		{"invalid UTF-8 path, its bytes as they are", frame(initproto.LeftCount, 1, "a\xffb"), LeftOut{Path: "a\xffb", Size: 1, Why: LeftCount}, true},
		{"unknown reason", frame(9, 1, "x"), LeftOut{}, false},
		{"size past int64", frame(initproto.LeftBytes, 1<<63, "x"), LeftOut{}, false},
		{"short", []byte{initproto.LeftBytes, 0, 0}, LeftOut{}, false},
	} {
		got, named := decodeLeftOut(tc.payload)
		if got != tc.want || named != tc.named {
			t.Errorf("decodeLeftOut(%s) = %+v, %v; want %+v, %v", tc.name, got, named, tc.want, tc.named)
		}
	}
}
