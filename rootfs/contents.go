package rootfs

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// A generation's contents file, beside it in the cache (<name>.contents),
// stamps every entry of the rootfs as it was built: its inode, size and
// change time. A server that starts on a cached generation compares them
// first, so that a file changed while no server watched (the Watcher sees
// what changes while one does) is never served: the change time moves
// with every write, through a mapping too, every chmod, every rename over.
// It lives outside the rootfs: inode numbers are nothing code needs.
//
//	mcp-exec rootfs contents 1
//	<ino>	<size>	<ctime ns>	"<path>"
const (
	contentsSuffix = ".contents"
	contentsHeader = "mcp-exec rootfs contents 1"
)

// writeContents stamps dir's entries into path.
func writeContents(dir, path string) error {
	var b strings.Builder
	b.WriteString(contentsHeader + "\n")
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		st, ok := stamp(p)
		if !ok {
			return fmt.Errorf("stamping %s", p)
		}
		rel, _ := filepath.Rel(dir, p)
		fmt.Fprintf(&b, "%d\t%d\t%d\t%s\n", st.ino, st.size, st.ctimeNs, strconv.Quote(rel))
		return nil
	})
	if err != nil {
		return fmt.Errorf("stamping the rootfs's contents: %w", err)
	}
	// Written aside and renamed into place: a reader never sees half of
	// it; what a killed writer left, tidy removes (tempPrefix).
	f, err := os.CreateTemp(filepath.Dir(path), tempPrefix+filepath.Base(path)+"-")
	if err != nil {
		return fmt.Errorf("stamping the rootfs's contents: %w", err)
	}
	_, werr := f.WriteString(b.String())
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Chmod(f.Name(), 0o644)
	}
	if werr == nil {
		werr = os.Rename(f.Name(), path)
	}
	if werr != nil {
		os.Remove(f.Name())
		return fmt.Errorf("stamping the rootfs's contents: %w", werr)
	}
	return nil
}

// errContentsChanged says a generation's files are not as they were built.
var errContentsChanged = errors.New("changed since it was built")

// checkContents compares dir's entries with the stamps in path: the first
// entry changed, added or gone is an error wrapping errContentsChanged.
// A generation built before contents files were written gets one now.
func checkContents(dir, path string) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return writeContents(dir, path)
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	if !sc.Scan() || sc.Text() != contentsHeader {
		return writeContents(dir, path) // another format: stamp it anew
	}
	want := map[string]fileStamp{}
	for sc.Scan() {
		var st fileStamp
		var q string
		if n, _ := fmt.Sscanf(sc.Text(), "%d\t%d\t%d\t%s", &st.ino, &st.size, &st.ctimeNs, &q); n != 4 {
			return fmt.Errorf("%s: a malformed line %q", path, sc.Text())
		}
		rel, err := strconv.Unquote(sc.Text()[strings.LastIndexByte(sc.Text(), '\t')+1:])
		if err != nil {
			return fmt.Errorf("%s: a malformed path in %q", path, sc.Text())
		}
		want[rel] = st
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return compareContents(dir, want)
}

// compareContents walks dir against want.
func compareContents(dir string, want map[string]fileStamp) error {
	seen := 0
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		was, ok := want[rel]
		now, stamped := stamp(p)
		switch {
		case !ok:
			return fmt.Errorf("%w: %s was added", errContentsChanged, rel)
		case !stamped || now.ino != was.ino:
			return fmt.Errorf("%w: %s was replaced", errContentsChanged, rel)
		case now != was:
			return fmt.Errorf("%w: %s was written (its size or change time moved)", errContentsChanged, rel)
		}
		seen++
		return nil
	})
	if err == nil && seen != len(want) {
		err = fmt.Errorf("%w: %d of its entries are gone", errContentsChanged, len(want)-seen)
	}
	return err
}
