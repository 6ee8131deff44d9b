package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// layer is a tar stream of hdrs, each regular file holding body.
func layer(t *testing.T, hdrs ...tar.Header) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range hdrs {
		body := ""
		if h.Typeflag == tar.TypeReg {
			body = strings.TrimSuffix(filepath.Base(h.Name), ".txt")
			h.Size = int64(len(body))
		}
		h.ModTime = time.Unix(1700000000, 0)
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatalf("writing %s: %v", h.Name, err)
		}
		if _, err := tw.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func reg(name string, mode int64) tar.Header {
	return tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode}
}

func dir(name string, mode int64) tar.Header {
	return tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode}
}

func symlink(name, target string) tar.Header {
	return tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777}
}

// seen says what is at p inside root, without following it.
func seen(root, p string) string {
	full := filepath.Join(root, p)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return "absent"
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, _ := os.Readlink(full)
		return "link " + target
	case unix.S_IFDIR:
		return fmt.Sprintf("dir %04o", st.Mode&0o7777)
	case unix.S_IFREG:
		b, _ := os.ReadFile(full)
		return fmt.Sprintf("file %04o %q", st.Mode&0o7777, b)
	default:
		return fmt.Sprintf("special %o", st.Mode)
	}
}

// TestApply applies a lower and an upper layer and checks, path by path,
// that whiteouts remove only what lower layers left, that no name leads out
// of the root, and that modes and types are the safe ones.
func TestApply(t *testing.T) {
	host := t.TempDir()
	root := filepath.Join(t.TempDir(), "root")
	if err := os.Mkdir(root, 0o700); err != nil {
		t.Fatal(err)
	}
	lower := layer(t,
		reg("gone.txt", 0o644),
		dir("d", 0o755), reg("d/x.txt", 0o644), reg("d/y.txt", 0o644),
		dir("o", 0o755), reg("o/old.txt", 0o644), dir("o/sub", 0o755), reg("o/sub/deep.txt", 0o644),
		symlink("out", host),
	)
	upper := layer(t,
		reg("o/new.txt", 0o644),
		reg("o/.wh..wh..opq", 0o644),
		reg("o/sub/fresh.txt", 0o644),
		reg(".wh.gone.txt", 0o644),
		reg("d/.wh.x.txt", 0o644),
		reg(".wh..wh.plnk", 0o644),
		reg("../dotdot.txt", 0o644),
		reg("out/through.txt", 0o644),
		reg("suid.txt", 0o4755),
		reg("gw.txt", 0o664),
		reg("private.txt", 0o600),
		dir("sgid", 0o2777),
		tar.Header{Typeflag: tar.TypeChar, Name: "null", Mode: 0o666, Devmajor: 1, Devminor: 3},
		tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o666},
		tar.Header{Typeflag: tar.TypeLink, Name: "hl", Linkname: "../../d/y.txt"},
	)
	b := NewBudget(1 << 20)
	for i, l := range [][]byte{lower, upper} {
		if err := Apply(context.Background(), root, bytes.NewReader(l), b); err != nil {
			t.Fatalf("Apply(layer %d): %v", i, err)
		}
	}
	for _, c := range []struct{ path, want string }{
		{"gone.txt", "absent"},
		{"d/x.txt", "absent"},
		{"d/y.txt", `file 0644 "y"`},
		{"o/old.txt", "absent"},
		{"o/sub/deep.txt", "absent"},
		{"o/new.txt", `file 0644 "new"`},
		{"o/sub/fresh.txt", `file 0644 "fresh"`},
		{"o/.wh..wh..opq", "absent"},
		{".wh..wh.plnk", "absent"},
		{"dotdot.txt", `file 0644 "dotdot"`},
		{host + "/through.txt", `file 0644 "through"`},
		{"out", "link " + host},
		{"suid.txt", `file 0755 "suid"`},
		{"gw.txt", `file 0644 "gw"`},
		{"private.txt", `file 0604 "private"`},
		{"sgid", "dir 0755"},
		{"null", "absent"},
		{"fifo", "absent"},
		{"hl", `file 0644 "y"`},
	} {
		if got := seen(root, c.path); got != c.want {
			t.Errorf("applied /%s = %s, want %s", c.path, got, c.want)
		}
	}
	if entries, _ := os.ReadDir(host); len(entries) != 0 {
		t.Errorf("the host dir a link named holds %d entries after Apply, want none", len(entries))
	}
	if _, err := os.Lstat(filepath.Join(filepath.Dir(root), "dotdot.txt")); err == nil {
		t.Errorf("a name with .. was written next to the root")
	}
}

// TestApplyBudget checks that both bounds stop a layer, and that Apply reads
// a layer to its end.
func TestApplyBudget(t *testing.T) {
	var bomb bytes.Buffer
	tw := tar.NewWriter(&bomb)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: 1 << 40, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	small := layer(t, reg("a.txt", 0o644))
	padded := append(slices.Clone(small), make([]byte, 1<<20)...)
	tests := []struct {
		name  string
		layer []byte
		max   int64
		want  string
	}{
		{"sparse file", bomb.Bytes(), 1 << 30, "big: the image's files take more than 1073741824 bytes, the limit"},
		{"long stream", padded, 1 << 19, "the image's layers unpack to more than 524288 bytes, the limit"},
		{"within", padded, 2 << 20, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := bytes.NewReader(tt.layer)
			err := Apply(context.Background(), t.TempDir(), r, NewBudget(tt.max))
			if tt.want == "" {
				if err != nil || r.Len() != 0 {
					t.Errorf("Apply = %v with %d bytes left unread, want nil, all read", err, r.Len())
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Apply = %v, want an error saying %q", err, tt.want)
			}
		})
	}
}

func TestApplyCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := Apply(ctx, t.TempDir(), bytes.NewReader(layer(t, reg("a.txt", 0o644))), NewBudget(1<<20))
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Apply(cancelled) = %v, want context.Canceled", err)
	}
}
