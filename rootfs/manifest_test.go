package rootfs

import (
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestManifestChanged(t *testing.T) {
	later := time.Now().Add(time.Hour)
	tests := []struct {
		name   string
		change func(dir string) error
		want   string // "" means unchanged; else the changed path (relative) and how
	}{
		{"nothing", func(string) error { return nil }, ""},
		{"file touched", func(dir string) error {
			return os.Chtimes(filepath.Join(dir, "file"), later, later)
		}, "file: mtime"},
		{"file grown", func(dir string) error {
			f, err := os.OpenFile(filepath.Join(dir, "file"), os.O_WRONLY|os.O_APPEND, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = f.WriteString("more")
			return err
		}, "file: size"},
		// A package manager's update: same size and mtime, new inode.
		{"file replaced by rename", func(dir string) error {
			p := filepath.Join(dir, "file")
			fi, err := os.Stat(p)
			if err != nil {
				return err
			}
			if err := os.WriteFile(p+".new", []byte("xyz"), 0o644); err != nil {
				return err
			}
			if err := os.Chtimes(p+".new", fi.ModTime(), fi.ModTime()); err != nil {
				return err
			}
			return os.Rename(p+".new", p)
		}, "file: inode"},
		{"file chmod", func(dir string) error {
			return os.Chmod(filepath.Join(dir, "file"), 0o600)
		}, "file: mode"},
		{"file removed", func(dir string) error {
			return os.Remove(filepath.Join(dir, "file"))
		}, "file: vanished"},
		{"file became a dir", func(dir string) error {
			p := filepath.Join(dir, "file")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Mkdir(p, 0o755)
		}, "file: was a file, is a dir"},
		{"absent path appeared", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "absent"), nil, 0o644)
		}, "absent: appeared"},
		{"link retargeted", func(dir string) error {
			p := filepath.Join(dir, "link")
			if err := os.Remove(p); err != nil {
				return err
			}
			return os.Symlink("elsewhere", p)
		}, `link: link target "elsewhere", was "file"`},
		{"entry added to a dir", func(dir string) error {
			return os.WriteFile(filepath.Join(dir, "dir/new.py"), nil, 0o644)
		}, "dir: mtime"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "file"), []byte("abc"), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("file", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
			if err := os.Mkdir(filepath.Join(dir, "dir"), 0o755); err != nil {
				t.Fatal(err)
			}
			// Old times, so that any change moves them, however coarse
			// the filesystem's clock.
			old := time.Now().Add(-time.Hour)
			for _, p := range []string{"file", "dir"} {
				if err := os.Chtimes(filepath.Join(dir, p), old, old); err != nil {
					t.Fatal(err)
				}
			}
			src := newSources()
			// "file/sub" fails with ENOTDIR, and stays absent.
			for _, p := range []string{"file", "link", "dir", "absent", "file/sub"} {
				src.stat(filepath.Join(dir, p))
			}
			m := src.manifest()

			if err := tt.change(dir); err != nil {
				t.Fatal(err)
			}
			got := m.changed()
			if tt.want == "" {
				if got != "" {
					t.Errorf("changed() = %q, want \"\"", got)
				}
				return
			}
			if want := filepath.Join(dir, tt.want); !strings.HasPrefix(got, want) {
				t.Errorf("changed() = %q, want it to start with %q", got, want)
			}
		})
	}
}

func TestManifestFormat(t *testing.T) {
	m := &manifest{Format: manifestFormat + 1}
	if got := m.changed(); !strings.Contains(got, "format") {
		t.Errorf("changed() of a manifest in another format = %q, want it to name the format", got)
	}
}

// The first record of a path wins: taken before the copy, it makes a file
// changed during a build look changed afterwards.
func TestSourcesFirstRecordWins(t *testing.T) {
	p := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(p, []byte("abc"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := newSources()
	src.stat(p)
	if err := os.WriteFile(p, []byte("abcdef"), 0o644); err != nil {
		t.Fatal(err)
	}
	src.stat(p)
	m := src.manifest()
	if len(m.Sources) != 1 || m.Sources[0].Size != 3 {
		t.Errorf("sources after two records of %s: %+v, want one, of size 3", p, m.Sources)
	}
	if got := m.changed(); !strings.Contains(got, "size") {
		t.Errorf("changed() = %q, want a size change", got)
	}
}

func TestManifestRoundTrip(t *testing.T) {
	dir := t.TempDir()
	want := &manifest{Format: manifestFormat, Sources: []source{
		{Path: "/usr/lib/libssl.so.3", Kind: kindFile, Size: 1 << 40, MtimeNs: -1, Ino: 1<<64 - 1, Mode: 0o755 | fs.ModeSetuid},
		{Path: "/usr/lib/python3", Kind: kindDir, MtimeNs: 1745849508123456789},
		{Path: "/lib/odd\tname\n\"quoted\" \xff", Kind: kindLink, Target: "../x y"},
		{Path: "/usr/local/lib/libssl.so.3", Kind: kindAbsent},
	}}
	for _, m := range []*manifest{want, {Format: manifestFormat}} {
		p := filepath.Join(dir, "gen.manifest")
		if err := writeManifest(p, m); err != nil {
			t.Fatal(err)
		}
		got, err := readManifest(p)
		if err != nil {
			t.Fatalf("readManifest(writeManifest(%d sources)): %v", len(m.Sources), err)
		}
		if got.Format != m.Format || !slices.Equal(got.Sources, m.Sources) {
			t.Errorf("readManifest(writeManifest(m)) = %+v, want %+v", got, m)
		}
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Errorf("manifest %s: mode %v (err %v), want 0600", p, fi.Mode().Perm(), err)
		}
		if got := strings.Join(dirNames(t, dir), " "); got != "gen.manifest" {
			t.Errorf("after writeManifest, %s holds %q, want only the manifest", dir, got)
		}
	}

	full := string(want.marshal())
	bad := map[string]string{
		"empty":        "",
		"no header":    "file\t1\t2\t3\t0644\t\"/x\"\n",
		"truncated":    strings.TrimSuffix(full, "\n"),
		"unknown kind": manifestHeader + "1\nsocket\t\"/x\"\n",
		"short line":   manifestHeader + "1\nfile\t1\t\"/x\"\n",
		"unquoted":     manifestHeader + "1\nabsent\t/x\n",
		"bad number":   manifestHeader + "1\ndir\tsoon\t\"/x\"\n",
	}
	for name, data := range bad {
		if m, err := unmarshalManifest(data); err == nil {
			t.Errorf("unmarshalManifest(%s) = %+v, want an error", name, m)
		}
	}
	// Another format reads, and is stale whatever it lists.
	m, err := unmarshalManifest(manifestHeader + "99\nwhatever\n")
	if err != nil || m.changed() == "" {
		t.Errorf("unmarshalManifest(format 99) = %+v, %v; want it read, and changed", m, err)
	}
}
