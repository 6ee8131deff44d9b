package rootfs

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"golang.org/x/sys/unix"
)

// describeAt says what is at p inside root, without following it.
func describeAt(root, p string) string {
	full := filepath.Join(root, p)
	var st unix.Stat_t
	if err := unix.Lstat(full, &st); err != nil {
		return "absent"
	}
	mode := st.Mode & 0o7777
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFLNK:
		target, _ := os.Readlink(full)
		return "link " + target
	case unix.S_IFDIR:
		return fmt.Sprintf("dir %04o", mode)
	case unix.S_IFREG:
		b, _ := os.ReadFile(full)
		return fmt.Sprintf("file %04o %q", mode, b)
	default:
		return fmt.Sprintf("special %o", st.Mode)
	}
}

// checkSafeTree asserts the invariants of a flattened tree on every entry.
func checkSafeTree(t *testing.T, root string) {
	t.Helper()
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		rel := "/" + strings.TrimPrefix(strings.TrimPrefix(p, root), "/")
		kind := st.Mode & unix.S_IFMT
		if kind != unix.S_IFDIR && kind != unix.S_IFREG && kind != unix.S_IFLNK {
			t.Errorf("%s: type %o, want a dir, file or symlink", rel, kind)
		}
		if os.Geteuid() == 0 && (st.Uid != 0 || st.Gid != 0) {
			t.Errorf("%s: owner %d:%d, want 0:0", rel, st.Uid, st.Gid)
		}
		if kind == unix.S_IFLNK {
			return nil
		}
		mode := st.Mode & 0o7777
		if mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
			t.Errorf("%s: mode %04o has setuid/setgid", rel, mode)
		}
		if rel == "/tmp" {
			if mode != 0o1777 {
				t.Errorf("/tmp: mode %04o, want 1777", mode)
			}
		} else if mode&0o1022 != 0 {
			t.Errorf("%s: mode %04o is group- or world-writable, or sticky", rel, mode)
		}
		if mode&0o004 == 0 || (kind == unix.S_IFDIR && mode&0o001 == 0) {
			t.Errorf("%s: mode %04o, want readable by others", rel, mode)
		}
		if _, err := unix.Lgetxattr(p, "security.capability", nil); err == nil {
			t.Errorf("%s: has file capabilities", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestFlattenImageMalicious flattens layers that try every way out of the
// dir and every unsafe mode, and checks what the tree holds, path by path.
func TestFlattenImageMalicious(t *testing.T) {
	// Outside /tmp, which the rootfs empties as a mount point: what is
	// written through a link to it must stay visible.
	hostDir, err := os.MkdirTemp("/var/tmp", "image-host-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(hostDir) })
	if err := os.WriteFile(filepath.Join(hostDir, "sentinel"), []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}
	hd := strings.TrimPrefix(hostDir, "/")

	lower := append(fakePython("usr/bin"),
		dirEntry("etc", 0o755),
		regEntry("etc/passwd", "image passwd\n", 0o644),
		regEntry("etc/shadow", "root:$6$hash:1::::::\n", 0o640),
		dirEntry("etc/ssl", 0o755),
		regEntry("etc/ssl/ca.pem", "CA", 0o644),
		symlinkEntry("etc/hostname", hostDir+"/sentinel"),
		regEntry("a", "a", 0o644),
		dirEntry("d", 0o755), regEntry("d/x", "x", 0o644), regEntry("d/y", "y", 0o644),
		dirEntry("o", 0o755), regEntry("o/old", "old", 0o644),
		dirEntry("o/sub", 0o755), regEntry("o/sub/deep", "deep", 0o644),
		dirEntry("tmp", 0o1777), regEntry("tmp/junk", "junk", 0o644),
		dirEntry("code", 0o755), regEntry("code/main.py", "print(1)", 0o644),
		dirEntry("s", 0o755), regEntry("s/inner", "inner", 0o644),
		symlinkEntry("hostlink", hostDir),
	)
	capFile := regEntry("capfile", "cap", 0o755)
	capFile.hdr.PAXRecords = map[string]string{"SCHILY.xattr.security.capability": "\x01\x00\x00\x02\x00\x20\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}
	upper := []tarEntry{
		// Before the opaque marker of its own dir: kept.
		regEntry("o/new", "new", 0o644),
		{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "o/.wh..wh..opq", Mode: 0o644}},
		regEntry("o/sub/fresh", "fresh", 0o644),
		{hdr: tar.Header{Typeflag: tar.TypeReg, Name: ".wh.a", Mode: 0o644}},
		{hdr: tar.Header{Typeflag: tar.TypeReg, Name: "d/.wh.x", Mode: 0o644}},
		regEntry("../escape", "escape", 0o644),
		regEntry("../../../.."+hostDir+"/pwned-dotdot", "dotdot", 0o644),
		regEntry("hostlink/pwned-link", "link", 0o644),
		symlinkEntry("s", hostDir),
		regEntry("s/pwned-s", "s", 0o644),
		regEntry("suid", "suid", 0o4755),
		dirEntry("sgid", 0o2777),
		regEntry("sgid/f", "f", 0o600),
		regEntry("ww", "ww", 0o666),
		regEntry("gw", "gw", 0o664),
		regEntry("private", "private", 0o600),
		{hdr: tar.Header{Typeflag: tar.TypeChar, Name: "devnull", Mode: 0o666, Devmajor: 1, Devminor: 3}},
		{hdr: tar.Header{Typeflag: tar.TypeBlock, Name: "sda", Mode: 0o660, Devmajor: 8}},
		{hdr: tar.Header{Typeflag: tar.TypeFifo, Name: "fifo", Mode: 0o666}},
		hardlinkEntry("hl", "../../../etc/ssl/ca.pem"),
		capFile,
		symlinkEntry("tmp", "/"),
		regEntry("etc/passwd-", "backup", 0o644),
	}
	img := imageOf(t, layerOf(t, lower...), layerOf(t, upper...))
	work := t.TempDir()
	cache := filepath.Join(work, "cache")
	im := flatten(t, saveTarball(t, work, map[string]v1.Image{"evil:1": img}), cache, ImageOptions{})

	for _, c := range []struct{ path, want string }{
		{"a", "absent"},
		{"d/x", "absent"},
		{"d/y", `file 0644 "y"`},
		{"o/old", "absent"},
		{"o/sub/deep", "absent"},
		{"o/new", `file 0644 "new"`},
		{"o/sub/fresh", `file 0644 "fresh"`},
		{"o/.wh..wh..opq", "absent"},
		{"escape", `file 0644 "escape"`},
		{hd + "/pwned-dotdot", `file 0644 "dotdot"`},
		{hd + "/pwned-link", `file 0644 "link"`},
		{hd + "/pwned-s", `file 0644 "s"`},
		{"s", "link " + hostDir},
		{"hostlink", "link " + hostDir},
		{"suid", `file 0755 "suid"`},
		{"sgid", "dir 0755"},
		{"sgid/f", `file 0604 "f"`},
		{"ww", `file 0644 "ww"`},
		{"gw", `file 0644 "gw"`},
		{"private", `file 0604 "private"`},
		{"devnull", "absent"},
		{"sda", "absent"},
		{"fifo", "absent"},
		{"hl", `file 0644 "CA"`},
		{"capfile", `file 0755 "cap"`},
		{"etc/passwd", fmt.Sprintf("file 0644 %q", etcFiles[0].content)},
		{"etc/passwd-", "absent"},
		{"etc/shadow", "absent"},
		{"etc/hostname", `file 0644 "sandbox\n"`},
		{"etc/ssl/ca.pem", `file 0644 "CA"`},
		{"tmp", "dir 1777"},
		{"tmp/junk", "absent"},
		{"code", "dir 0755"},
		{"code/main.py", "absent"},
		{"proc", "dir 0755"},
		{"dev", "dir 0755"},
		{"usr/bin/python3", "link python3.12"},
	} {
		if got := describeAt(im.Dir, c.path); got != c.want {
			t.Errorf("flattened /%s = %s, want %s", c.path, got, c.want)
		}
	}
	var hl, ca unix.Stat_t
	if unix.Lstat(filepath.Join(im.Dir, "hl"), &hl) == nil && unix.Lstat(filepath.Join(im.Dir, "etc/ssl/ca.pem"), &ca) == nil && hl.Ino != ca.Ino {
		t.Errorf("/hl is inode %d, want a hard link to /etc/ssl/ca.pem (inode %d)", hl.Ino, ca.Ino)
	}
	checkSafeTree(t, im.Dir)

	// Nothing reached the host.
	if got := entryNames(t, hostDir); !slices.Equal(got, []string{"sentinel"}) {
		t.Errorf("host dir %s holds %q after flattening, want only [sentinel]", hostDir, got)
	}
	if b, _ := os.ReadFile(filepath.Join(hostDir, "sentinel")); string(b) != "host" {
		t.Errorf("host file %s/sentinel = %q after flattening, want %q", hostDir, b, "host")
	}
	for _, p := range []string{filepath.Join(cache, "escape"), filepath.Join(work, "escape")} {
		if _, err := os.Lstat(p); err == nil {
			t.Errorf("%s exists: a layer wrote out of the rootfs", p)
		}
	}
	if im.Python != "/usr/bin/python3" || im.PythonVersion != "3.12" {
		t.Errorf("FlattenImage: Python, PythonVersion = %q, %q, want /usr/bin/python3, 3.12", im.Python, im.PythonVersion)
	}
}

// TestFlattenImagePython checks where FlattenImage finds python3 and what it
// adds so that PythonPath works too.
func TestFlattenImagePython(t *testing.T) {
	slimLib := []tarEntry{dirEntry("usr/local/lib", 0o755), dirEntry("usr/local/lib/python3.12", 0o755), regEntry("usr/local/lib/python3.12/os.py", "", 0o644)}
	tests := []struct {
		name                    string
		entries                 []tarEntry
		wantPython, wantVersion string
		wantPythonPath          string // what describe says of PythonPath
	}{
		{
			name:       "python:slim",
			entries:    append(fakePython("usr/local/bin"), dirEntry("usr/bin", 0o755)),
			wantPython: "/usr/local/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link /usr/local/bin/python3",
		},
		{
			name:       "slim without /usr/bin",
			entries:    fakePython("usr/local/bin"),
			wantPython: "/usr/local/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link /usr/local/bin/python3",
		},
		{
			name:       "debian",
			entries:    fakePython("usr/bin"),
			wantPython: "/usr/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link python3.12",
		},
		{
			name:       "both: PATH order",
			entries:    append(fakePython("usr/bin"), fakePython("usr/local/bin")[2:]...),
			wantPython: "/usr/local/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link python3.12",
		},
		{
			name: "version from the stdlib dir",
			entries: append([]tarEntry{dirEntry("usr", 0o755), dirEntry("usr/local", 0o755), dirEntry("usr/local/bin", 0o755),
				regEntry("usr/local/bin/python3", "#!/bin/false\n", 0o755)}, slimLib...),
			wantPython: "/usr/local/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link /usr/local/bin/python3",
		},
		{
			name:       "absolute link resolved in the image",
			entries:    append(fakePython("opt/py/bin"), dirEntry("usr", 0o755), dirEntry("usr/bin", 0o755), symlinkEntry("usr/bin/python3", "/opt/py/bin/python3.12")),
			wantPython: "/usr/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link /opt/py/bin/python3.12",
		},
		{
			name:       "dangling /usr/bin/python3 replaced",
			entries:    append(fakePython("usr/local/bin"), dirEntry("usr/bin", 0o755), symlinkEntry("usr/bin/python3", "/nowhere")),
			wantPython: "/usr/local/bin/python3", wantVersion: "3.12",
			wantPythonPath: "link /usr/local/bin/python3",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			work := t.TempDir()
			src := saveLayout(t, work, map[string]v1.Image{"": imageOf(t, layerOf(t, tt.entries...))})
			im := flatten(t, src, filepath.Join(work, "cache"), ImageOptions{})
			if im.Python != tt.wantPython || im.PythonVersion != tt.wantVersion {
				t.Errorf("FlattenImage: Python, PythonVersion = %q, %q, want %q, %q", im.Python, im.PythonVersion, tt.wantPython, tt.wantVersion)
			}
			if got := describeAt(im.Dir, PythonPath); got != tt.wantPythonPath {
				t.Errorf("FlattenImage: %s = %s, want %s", PythonPath, got, tt.wantPythonPath)
			}
			if err := Check(im.Dir); err != nil {
				t.Errorf("Check(flattened): %v", err)
			}
		})
	}
}

// TestFlattenImagePicks checks how src picks one image of several, in both
// formats, and that one image has one digest whichever format holds it.
func TestFlattenImagePicks(t *testing.T) {
	one := imageOf(t, layerOf(t, append(fakePython("usr/bin"), regEntry("which", "one", 0o644))...))
	two := imageOf(t, layerOf(t, append(fakePython("usr/bin"), regEntry("which", "two", 0o644))...))
	work := t.TempDir()
	tb := saveTarball(t, work, map[string]v1.Image{"example.com/img:one": one, "img:two": two})
	lay := saveLayout(t, work, map[string]v1.Image{"one": one, "two": two})
	cache := filepath.Join(work, "cache")

	digest := func(img v1.Image) string {
		h, err := img.ConfigName()
		if err != nil {
			t.Fatal(err)
		}
		return h.String()
	}
	for _, c := range []struct{ src, want, digest string }{
		{tb + ":example.com/img:one", "one", digest(one)},
		{tb + ":img:two", "two", digest(two)},
		{tb + ":docker.io/library/img:two", "two", digest(two)},
		{lay + ":one", "one", digest(one)},
		{lay + ":two", "two", digest(two)},
	} {
		im := flatten(t, c.src, cache, ImageOptions{})
		if got := describeAt(im.Dir, "which"); got != fmt.Sprintf("file 0644 %q", c.want) || im.Digest != c.digest {
			t.Errorf("FlattenImage(%s): /which = %s, digest %s; want %q, %s", c.src, got, im.Digest, c.want, c.digest)
		}
	}
	// Each image was flattened once, whichever file it came from.
	var dirs []string
	for _, n := range entryNames(t, cache) {
		if strings.HasPrefix(n, imagePrefix) && !strings.HasSuffix(n, holdSuffix) && !strings.HasSuffix(n, aboutSuffix) {
			dirs = append(dirs, n)
		}
	}
	if len(dirs) != 2 {
		t.Errorf("cache holds images %q, want 2", dirs)
	}
}

// TestFlattenImageMultiPlatform picks this host's image from a layout whose
// entry is a multi-platform index.
func TestFlattenImageMultiPlatform(t *testing.T) {
	other := "arm64"
	if goruntime.GOARCH == "arm64" {
		other = "amd64"
	}
	mine := imageOf(t, layerOf(t, append(fakePython("usr/bin"), regEntry("arch", goruntime.GOARCH, 0o644))...))
	theirs := imageFor(t, other, layerOf(t, append(fakePython("usr/bin"), regEntry("arch", other, 0o644))...))
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: theirs, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: other}}},
		mutate.IndexAddendum{Add: mine, Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}}},
	)
	work := t.TempDir()
	p := filepath.Join(work, "layout")
	lp, err := layout.Write(p, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := lp.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "multi"})); err != nil {
		t.Fatal(err)
	}
	im := flatten(t, p, filepath.Join(work, "cache"), ImageOptions{})
	if got, want := describeAt(im.Dir, "arch"), fmt.Sprintf("file 0644 %q", goruntime.GOARCH); got != want {
		t.Errorf("FlattenImage(multi-platform layout): /arch = %s, want %s", got, want)
	}
}

// TestFlattenImageErrors checks that every refusal names the variable and
// what is wrong, and leaves nothing in the cache but its lock.
func TestFlattenImageErrors(t *testing.T) {
	work := t.TempDir()
	py := fakePython("usr/bin")
	good := imageOf(t, layerOf(t, py...))
	goodTar := saveTarball(t, work, map[string]v1.Image{"good:1": good})

	mk := func(name string, f func(p string)) string {
		p := filepath.Join(work, name)
		f(p)
		return p
	}
	write := func(p, content string) {
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	in := func(name string, imgs map[string]v1.Image, save func(testing.TB, string, map[string]v1.Image) string) string {
		d := filepath.Join(work, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return save(t, d, imgs)
	}
	layerFile := func(name string, entries ...tarEntry) string {
		p := filepath.Join(work, name+".layer")
		if err := os.WriteFile(p, layerBytes(t, entries...), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	// A header that promises a terabyte, and nothing after it.
	var bomb bytes.Buffer
	tw := tar.NewWriter(&bomb)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: "big", Size: 1 << 40, Mode: 0o644}); err != nil {
		t.Fatal(err)
	}
	// A small layer, then 64 MiB of zeros after its end, which gzip to
	// 64 KiB: no file is big, the stream is.
	zeros := bytes.NewBuffer(layerBytes(t, py...))
	zeros.Write(make([]byte, 64<<20))

	tests := []struct {
		name string
		src  string
		opts ImageOptions
		want []string
	}{
		{"missing", filepath.Join(work, "nothere.tar"), ImageOptions{}, []string{"nothere.tar does not exist"}},
		{"plain dir", mk("plain", func(p string) { os.Mkdir(p, 0o755) }), ImageOptions{}, []string{"not an OCI image layout"}},
		{"text file", mk("text", func(p string) { write(p, "hello") }), ImageOptions{}, []string{"not a `docker save` tarball"}},
		{"gzipped tarball", mk("img.tar.gz", func(p string) {
			b, err := os.ReadFile(goodTar)
			if err != nil {
				t.Fatal(err)
			}
			var buf bytes.Buffer
			zw := gzip.NewWriter(&buf)
			zw.Write(b)
			zw.Close()
			write(p, buf.String())
		}), ImageOptions{}, []string{"gzip-compressed", "gunzip"}},
		{"oci archive", mk("oci.tar", func(p string) {
			lay := in("for-archive", map[string]v1.Image{"": good}, saveLayout)
			if out, err := exec.Command("tar", "-cf", p, "-C", lay, ".").CombinedOutput(); err != nil {
				t.Fatalf("tar: %v: %s", err, out)
			}
		}), ImageOptions{}, []string{"is an OCI archive", "tar -xf"}},
		{"several in tarball", in("several-tar", map[string]v1.Image{"a:1": good, "b:2": imageOf(t, layerOf(t, py...), layerOf(t))}, saveTarball),
			ImageOptions{}, []string{"holds 2 images", "a:1", "b:2", ":TAG"}},
		{"tag not in tarball", goodTar + ":other:1", ImageOptions{}, []string{"no image tagged other:1", "good:1"}},
		{"several in layout", in("several-layout", map[string]v1.Image{"x": good, "y": imageOf(t, layerOf(t, py...), layerOf(t))}, saveLayout),
			ImageOptions{}, []string{"holds 2 images", "x, y", ":REF"}},
		{"no python", in("nopython", map[string]v1.Image{"": imageOf(t, layerOf(t, regEntry("usr/bin/python3", "not executable", 0o644)))}, saveLayout),
			ImageOptions{}, []string{"has no python3", "/usr/local/bin/python3", "/usr/bin/python3"}},
		{"other arch", in("arch", map[string]v1.Image{"": imageFor(t, "s390x", layerOf(t, py...))}, saveLayout),
			ImageOptions{}, []string{"is for s390x", goruntime.GOARCH}},
		{"corrupt layer", dockerSave(t, filepath.Join(work, "corrupt.tar"), "c:1",
			[]string{layerFile("corrupt", py...)}, []string{"sha256:" + strings.Repeat("ab", 32)}),
			ImageOptions{}, []string{"layer 1 of 1", "the image is corrupt"}},
		{"hard link to nothing", in("hardlink", map[string]v1.Image{"": imageOf(t, layerOf(t, append(py, hardlinkEntry("x", "nothere"))...))}, saveLayout),
			ImageOptions{}, []string{"x: hard link to nothere: no such file in the image"}},
		{"bigger than MaxBytes", goodTar, ImageOptions{MaxBytes: 1000}, []string{"more than 1000 bytes, the limit"}},
		{"sparse bomb", in("bomb", map[string]v1.Image{"": imageOf(t, bytesLayer(t, bomb.Bytes()))}, saveLayout),
			ImageOptions{}, []string{"big: the image's files take more than 17179869184 bytes"}},
		{"decompression bomb", in("zeros", map[string]v1.Image{"": imageOf(t, bytesLayer(t, zeros.Bytes()))}, saveLayout),
			ImageOptions{MaxBytes: 16 << 20}, []string{"the image's layers unpack to more than 16777216 bytes"}},
		{"failing prepare", goodTar, ImageOptions{Prepare: func(context.Context, string, string) error { return errors.New("no compiler") }},
			[]string{"preparing the flattened image: no compiler"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cache := filepath.Join(t.TempDir(), "cache")
			_, err := FlattenImage(context.Background(), tt.src, cache, tt.opts)
			if err == nil {
				t.Fatalf("FlattenImage(%s): no error, want one saying %q", tt.src, tt.want)
			}
			for _, w := range append([]string{imageField + "=" + tt.src + ": "}, tt.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("FlattenImage(%s) = %v, want it to say %q", tt.src, err, w)
				}
			}
			if names, err := os.ReadDir(cache); err == nil && len(names) > 1 {
				t.Errorf("after a failed FlattenImage, cache holds %q, want only .lock", entryNames(t, cache))
			}
		})
	}
}

func TestFlattenImageCancelled(t *testing.T) {
	work := t.TempDir()
	big := regEntry("big", strings.Repeat("x", 8<<20), 0o644)
	src := saveLayout(t, work, map[string]v1.Image{"": imageOf(t, layerOf(t, append(fakePython("usr/bin"), big)...))})
	cache := filepath.Join(work, "cache")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := FlattenImage(ctx, src, cache, ImageOptions{})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("FlattenImage(cancelled) = %v, want context.Canceled", err)
	}
	if got := entryNames(t, cache); !slices.Equal(got, []string{".lock"}) {
		t.Errorf("after a cancelled FlattenImage, cache holds %q, want only .lock", got)
	}
}

// TestFlattenImagePrepare checks that Prepare runs once, on the whole tree,
// and that what it leaves is made safe before it is cached.
func TestFlattenImagePrepare(t *testing.T) {
	work := t.TempDir()
	src := saveLayout(t, work, map[string]v1.Image{"": imageOf(t, layerOf(t, fakePython("usr/local/bin")...))})
	var calls atomic.Int32
	prepare := func(ctx context.Context, dir, py string) error {
		calls.Add(1)
		if py != "/usr/local/bin/python3" {
			return fmt.Errorf("python = %q", py)
		}
		// What a sandbox with a writable root might leave.
		if err := os.WriteFile(filepath.Join(dir, "usr/local/bin/compiled.pyc"), []byte("pyc"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "suid"), []byte("x"), 0o644); err != nil {
			return err
		}
		if err := unix.Chmod(filepath.Join(dir, "suid"), 0o4777); err != nil {
			return err
		}
		if err := unix.Mkfifo(filepath.Join(dir, "fifo"), 0o666); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "tmp/left"), []byte("x"), 0o644); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, "etc/passwd"), []byte("changed"), 0o644); err != nil {
			return err
		}
		if os.Geteuid() == 0 {
			if err := os.Lchown(filepath.Join(dir, "suid"), 65532, 65532); err != nil {
				return err
			}
		}
		return nil
	}
	cache := filepath.Join(work, "cache")
	im := flatten(t, src, cache, ImageOptions{Prepare: prepare})
	im2 := flatten(t, src, cache, ImageOptions{Prepare: prepare})
	if n := calls.Load(); n != 1 || im2.Dir != im.Dir {
		t.Errorf("two FlattenImage calls: Prepare ran %d times, dirs %s and %s; want once, one dir", n, im.Dir, im2.Dir)
	}
	for _, c := range []struct{ path, want string }{
		{"usr/local/bin/compiled.pyc", `file 0644 "pyc"`},
		{"suid", `file 0755 "x"`},
		{"fifo", "absent"},
		{"tmp/left", "absent"},
		{"etc/passwd", fmt.Sprintf("file 0644 %q", etcFiles[0].content)},
	} {
		if got := describeAt(im.Dir, c.path); got != c.want {
			t.Errorf("flattened after Prepare: /%s = %s, want %s", c.path, got, c.want)
		}
	}
	checkSafeTree(t, im.Dir)
}
