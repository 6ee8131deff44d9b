package runtime

import (
	"strings"
	"testing"
)

// What the host makes of a stream's head and the bytes past it: whole
// within the cap, else head and tail around the count of what was left
// out; the init's final tail replaces the newest bytes a watched call was
// sent; a UTF-8 character is never cut.
func TestStreamBuffer(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fill  func(b *streamBuffer)
		limit int64
		total int64
		want  string
		cut   bool
	}{
		{"whole", func(b *streamBuffer) { b.writeHead([]byte("abcdef")) }, 6, 6, "abcdef", false},
		{"head and tail contiguous", func(b *streamBuffer) { b.writeHead([]byte("abc")); b.writePast(3, []byte("def")) }, 6, 6, "abcdef", false},
		{"cut here", func(b *streamBuffer) { b.writeHead([]byte(strings.Repeat("a", 40) + strings.Repeat("z", 40))) }, 60, 80,
			strings.Repeat("a", 16) + "\n[… 49 bytes left out …]\n" + strings.Repeat("z", 15), true},
		{"tail apart", func(b *streamBuffer) {
			b.writeHead([]byte(strings.Repeat("a", 30)))
			b.writePast(1000, []byte(strings.Repeat("z", 30)))
		}, 60, 1030,
			strings.Repeat("a", 15) + "\n[… 1001 bytes left out …]\n" + strings.Repeat("z", 14), true},
		{"live bytes replaced by the tail", func(b *streamBuffer) {
			b.writeHead([]byte(strings.Repeat("a", 30)))
			b.writePast(500, []byte("newest"))
			b.writePast(2000, []byte("newer"))
			b.writePast(1000, []byte(strings.Repeat("z", 1005)))
		}, 62, 2005, strings.Repeat("a", 16) + "\n[… 1974 bytes left out …]\n" + strings.Repeat("z", 15), true},
		{"the init gone: the end unknown", func(b *streamBuffer) { b.writeHead([]byte(strings.Repeat("a", 30))) }, 40, 100,
			strings.Repeat("a", 10) + "\n[… 90 bytes left out …]\n", true},
		{"characters whole", func(b *streamBuffer) { b.writeHead([]byte(strings.Repeat("é", 40))) }, 60, 80,
			strings.Repeat("é", 8) + "\n[… 50 bytes left out …]\n" + strings.Repeat("é", 7), true},
	} {
		b := newStreamBuffer(1 << 20)
		tc.fill(b)
		got, cut := b.result(tc.limit, tc.total)
		if string(got) != tc.want || cut != tc.cut || int64(len(got)) > tc.limit {
			t.Errorf("%s: result(%d, %d) = %q (%d bytes), %v; want %q, %v", tc.name, tc.limit, tc.total, got, len(got), cut, tc.want, tc.cut)
		}
	}
}
