package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// manifestFormat is the layout of a manifest. A manifest of another format is
// stale, so changing it rebuilds every cached rootfs once.
const manifestFormat = 1

// manifest lists what a rootfs was built from, so that Ensure can tell, with
// one lstat per entry, whether the host still has exactly that: every file,
// stdlib dir and symlink copied, the ld.so.conf files read, and every path the
// library resolver looked at, found or not — a library that appears earlier
// in the search order changes what the loader would pick.
//
// It lives next to its generation in the cache, never inside the rootfs:
// host paths, sizes and inode numbers are nothing sandboxed code needs to see.
//
// On disk it is text, one source a line, fields split by tabs, paths quoted
// (so that no path can hold a tab or a newline): JSON took longer to decode
// than the lstats it saves to take.
//
//	mcp-exec rootfs manifest 1
//	file	<size>	<mtime ns>	<inode>	<fs.FileMode, octal>	"<path>"
//	dir	<mtime ns>	"<path>"
//	link	"<path>"	"<target>"
//	absent	"<path>"
type manifest struct {
	Format  int
	Sources []source
}

// manifestHeader starts every manifest, followed by its format.
const manifestHeader = "mcp-exec rootfs manifest "

type sourceKind string

const (
	// kindAbsent: the path did not exist (or could not be looked at).
	kindAbsent sourceKind = "absent"
	kindFile   sourceKind = "file"
	kindDir    sourceKind = "dir"
	kindLink   sourceKind = "link"
)

// source is one host path as Lstat saw it. A file is the same when its size,
// mtime, inode and mode are: every package manager replaces a file by
// renaming a new one over it (new inode), and an in-place write moves the
// mtime. The device number is left out: btrfs subvolumes and overlayfs get a
// new one at every mount, which would rebuild after every reboot. A dir is
// compared by its mtime alone, which moves when an entry is added, removed or
// renamed: a new extension module in lib-dynload is a change.
type source struct {
	Path    string
	Kind    sourceKind
	Size    int64
	MtimeNs int64
	Ino     uint64
	Mode    fs.FileMode
	Target  string // a link's target
}

// describe turns what Lstat(p) returned into a source. Any error counts as
// absent: a path that cannot be looked at now and could not then has not
// changed as far as anyone can tell.
func describe(p string, fi fs.FileInfo, err error) source {
	if err != nil {
		return source{Path: p, Kind: kindAbsent}
	}
	s := source{Path: p}
	switch m := fi.Mode(); {
	case m&fs.ModeSymlink != 0:
		s.Kind = kindLink
		target, err := os.Readlink(p)
		if err != nil {
			return source{Path: p, Kind: kindAbsent}
		}
		s.Target = target
	case m.IsDir():
		s.Kind = kindDir
		s.MtimeNs = fi.ModTime().UnixNano()
	default:
		// Regular files, and the odd special file a probe met.
		s.Kind = kindFile
		s.Size = fi.Size()
		s.MtimeNs = fi.ModTime().UnixNano()
		s.Mode = m
		if st, ok := fi.Sys().(*syscall.Stat_t); ok {
			s.Ino = st.Ino
		}
	}
	return s
}

// differs says how got, the host now, differs from s; "" if it does not.
func (s source) differs(got source) string {
	switch {
	case s.Kind == got.Kind:
	case s.Kind == kindAbsent:
		return "appeared"
	case got.Kind == kindAbsent:
		return "vanished"
	default:
		return fmt.Sprintf("was a %s, is a %s", s.Kind, got.Kind)
	}
	switch {
	case s.Target != got.Target:
		return fmt.Sprintf("link target %q, was %q", got.Target, s.Target)
	case s.Size != got.Size:
		return fmt.Sprintf("size %d, was %d", got.Size, s.Size)
	case s.MtimeNs != got.MtimeNs:
		return fmt.Sprintf("mtime %d, was %d", got.MtimeNs, s.MtimeNs)
	case s.Ino != got.Ino:
		return fmt.Sprintf("inode %d, was %d", got.Ino, s.Ino)
	case s.Mode != got.Mode:
		return fmt.Sprintf("mode %v, was %v", got.Mode, s.Mode)
	}
	return ""
}

// changed returns the first difference between m and the host, naming the
// path, or "" when the host still has everything m lists, as m lists it.
func (m *manifest) changed() string {
	if m.Format != manifestFormat {
		return fmt.Sprintf("manifest format %d, want %d", m.Format, manifestFormat)
	}
	for _, s := range m.Sources {
		fi, err := os.Lstat(s.Path)
		if d := s.differs(describe(s.Path, fi, err)); d != "" {
			return s.Path + ": " + d
		}
	}
	return ""
}

// sources collects a manifest during a build. The first record of a path
// wins: it is taken before the copy (or before the resolver reads the file),
// so a file that changes during the build looks changed afterwards, never
// the other way round. A nil *sources records nothing.
type sources struct {
	seen map[string]bool
	list []source
}

func newSources() *sources {
	return &sources{seen: map[string]bool{}}
}

// record adds p as described by an Lstat already made.
func (s *sources) record(p string, fi fs.FileInfo, err error) {
	if s == nil || s.seen[p] {
		return
	}
	s.seen[p] = true
	s.list = append(s.list, describe(p, fi, err))
}

// stat adds p as Lstat sees it now.
func (s *sources) stat(p string) {
	if s == nil || s.seen[p] {
		return
	}
	fi, err := os.Lstat(p)
	s.record(p, fi, err)
}

func (s *sources) manifest() *manifest {
	m := &manifest{Format: manifestFormat}
	if s != nil {
		m.Sources = append([]source(nil), s.list...)
	}
	return m
}

// writeManifest writes m to p, 0600, atomically: through a temp file in the
// same dir, named so that the cache's tidy takes it if the writer dies.
func writeManifest(p string, m *manifest) (retErr error) {
	f, err := os.CreateTemp(filepath.Dir(p), tempPrefix+filepath.Base(p)+"-")
	if err != nil {
		return fmt.Errorf("writing manifest %s: %w", p, err)
	}
	defer func() {
		if retErr != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes it 0600; say so rather than rely on it.
	if err := f.Chmod(0o600); err != nil {
		return fmt.Errorf("writing manifest %s: %w", p, err)
	}
	if _, err := f.Write(m.marshal()); err != nil {
		return fmt.Errorf("writing manifest %s: %w", p, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("writing manifest %s: %w", p, err)
	}
	if err := os.Rename(f.Name(), p); err != nil {
		return fmt.Errorf("writing manifest %s: %w", p, err)
	}
	return nil
}

func (m *manifest) marshal() []byte {
	b := []byte(manifestHeader + strconv.Itoa(m.Format) + "\n")
	for _, s := range m.Sources {
		b = append(b, s.Kind...)
		switch s.Kind {
		case kindFile:
			b = fmt.Appendf(b, "\t%d\t%d\t%d\t%#o", s.Size, s.MtimeNs, s.Ino, uint32(s.Mode))
		case kindDir:
			b = fmt.Appendf(b, "\t%d", s.MtimeNs)
		}
		b = append(b, '\t')
		b = strconv.AppendQuote(b, s.Path)
		if s.Kind == kindLink {
			b = append(b, '\t')
			b = strconv.AppendQuote(b, s.Target)
		}
		b = append(b, '\n')
	}
	return b
}

// readManifest reads the manifest at p.
func readManifest(p string) (*manifest, error) {
	data, err := os.ReadFile(p)
	if err != nil {
		return nil, fmt.Errorf("reading manifest: %w", err)
	}
	m, err := unmarshalManifest(string(data))
	if err != nil {
		return nil, fmt.Errorf("reading manifest %s: %w", p, err)
	}
	return m, nil
}

func unmarshalManifest(data string) (*manifest, error) {
	header, rest, ok := strings.Cut(data, "\n")
	if !ok || !strings.HasPrefix(header, manifestHeader) {
		return nil, errors.New("no manifest header")
	}
	format, err := strconv.Atoi(strings.TrimPrefix(header, manifestHeader))
	if err != nil {
		return nil, fmt.Errorf("header %q: %w", header, err)
	}
	m := &manifest{Format: format}
	if format != manifestFormat {
		// Stale whatever it lists; changed() says so.
		return m, nil
	}
	if rest == "" {
		return m, nil
	}
	if !strings.HasSuffix(rest, "\n") {
		return nil, errors.New("truncated")
	}
	for i, line := range strings.Split(strings.TrimSuffix(rest, "\n"), "\n") {
		s, err := parseSource(line)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", i+2, err)
		}
		m.Sources = append(m.Sources, s)
	}
	return m, nil
}

func parseSource(line string) (source, error) {
	f := strings.Split(line, "\t")
	s := source{Kind: sourceKind(f[0])}
	var fields int
	switch s.Kind {
	case kindFile:
		fields = 6
	case kindDir, kindLink:
		fields = 3
	case kindAbsent:
		fields = 2
	default:
		return s, fmt.Errorf("%q: unknown kind", line)
	}
	if len(f) != fields {
		return s, fmt.Errorf("%q: %d fields, want %d", line, len(f), fields)
	}
	var err error
	keep := func(e error) {
		if err == nil {
			err = e
		}
	}
	num := func(i int) int64 {
		n, e := strconv.ParseInt(f[i], 10, 64)
		keep(e)
		return n
	}
	unum := func(i int) uint64 {
		n, e := strconv.ParseUint(f[i], 0, 64)
		keep(e)
		return n
	}
	str := func(i int) string {
		s, e := strconv.Unquote(f[i])
		keep(e)
		return s
	}
	switch s.Kind {
	case kindFile:
		s.Size, s.MtimeNs, s.Ino, s.Mode, s.Path = num(1), num(2), unum(3), fs.FileMode(unum(4)), str(5)
	case kindDir:
		s.MtimeNs, s.Path = num(1), str(2)
	case kindLink:
		s.Path, s.Target = str(1), str(2)
	case kindAbsent:
		s.Path = str(1)
	}
	if err != nil {
		return s, fmt.Errorf("%q: %w", line, err)
	}
	return s, nil
}
