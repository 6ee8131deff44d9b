package rootfs

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// What a cache dir holds, and removing what no process uses: List says
// what each entry is, how big, when last used and whether a process holds
// it; Prune removes, least recently used first, the entries no process
// holds. Whether an entry is in use is the kernel's word, never a guess:
// every process using one holds a shared flock on its hold file (cache.go),
// and an entry is removed only under an exclusive one, so a rootfs that a
// server of any instance on the host runs on is never removed.

// aboutSuffix ends the name of an entry's about file: what it holds, in
// JSON, written once the entry is in place. An entry without one (made by
// an older mcp-exec, or whose builder died just then) is listed as
// unknown.
const aboutSuffix = ".about"

// About says what a cached rootfs holds.
type About struct {
	// Python and PythonVersion are the host interpreter a built rootfs
	// came from.
	Python        string `json:"python,omitempty"`
	PythonVersion string `json:"python_version,omitempty"`
	// Packages are the Debian packages it was built with (normalized),
	// Shell and Preload as asked.
	Packages []string `json:"packages,omitempty"`
	Shell    bool     `json:"shell,omitempty"`
	Preload  []string `json:"preload,omitempty"`
	// Image is the image a flattened entry came from, Digest its config
	// digest.
	Image  string `json:"image,omitempty"`
	Digest string `json:"digest,omitempty"`
	// Built is when it entered the cache.
	Built time.Time `json:"built"`
	// Derived: there was no about file, and this was read from the
	// manifest of a built rootfs: Packages has the dependencies too.
	Derived bool `json:"derived,omitempty"`
}

// String says what a holds in a line.
func (a About) String() string {
	var parts []string
	if a.Image != "" {
		parts = append(parts, "image "+a.Image+" ("+a.Digest+")")
	}
	if a.PythonVersion != "" {
		parts = append(parts, "python "+a.PythonVersion)
	}
	switch {
	case a.Image != "":
	case len(a.Packages) == 0:
		parts = append(parts, "standard library only")
	case a.Derived:
		parts = append(parts, "packages with their dependencies: "+strings.Join(a.Packages, " "))
	default:
		parts = append(parts, strings.Join(a.Packages, " "))
	}
	if a.Shell {
		parts = append(parts, "shell")
	}
	if len(a.Preload) > 0 {
		parts = append(parts, "preload "+strings.Join(a.Preload, ","))
	}
	return strings.Join(parts, "; ")
}

// describe writes entry name's about file, atomically. It is best effort:
// without it the entry works, and is listed as unknown.
func (c cache) describe(name string, a About) {
	data, err := json.Marshal(a)
	if err != nil {
		return
	}
	f, err := os.CreateTemp(c.dir, tempPrefix+name+aboutSuffix+"-")
	if err != nil {
		return
	}
	// Package names and a version: readable by a user listing the cache.
	_, werr := f.Write(append(data, '\n'))
	if err := f.Chmod(0o644); werr == nil {
		werr = err
	}
	if err := f.Close(); werr == nil {
		werr = err
	}
	if werr != nil || os.Rename(f.Name(), filepath.Join(c.dir, name+aboutSuffix)) != nil {
		os.Remove(f.Name())
	}
}

// tidyAbouts removes about files whose entry is gone (an older mcp-exec
// removed it, knowing nothing of them). The caller holds the lock.
func tidyAbouts(dir string, entries []fs.DirEntry) error {
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), aboutSuffix)
		if !ok {
			name, ok = strings.CutSuffix(e.Name(), contentsSuffix)
		}
		if !ok || isLeftover(e.Name()) {
			continue
		}
		if _, err := os.Lstat(filepath.Join(dir, name)); !errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("removing %s: %w", e.Name(), err)
		}
	}
	return nil
}

// aboutFromManifest says what a built rootfs without an about file holds,
// as its manifest tells it: the Debian packages whose file lists it was
// built from (the named ones with what they depend on), the shell's among
// them. Nil when the manifest cannot be read.
func aboutFromManifest(p string) *About {
	m, err := readManifest(p)
	if err != nil {
		return nil
	}
	a := &About{Derived: true}
	for _, src := range m.Sources {
		name, ok := strings.CutPrefix(src.Path, dpkgDir+"/info/")
		if !ok || src.Kind != kindFile {
			continue
		}
		if name, ok = strings.CutSuffix(name, ".list"); !ok {
			continue
		}
		name, _, _ = strings.Cut(name, ":") // python3-pil:amd64
		if name == "busybox-static" {
			a.Shell = true
			continue
		}
		if !slices.Contains(a.Packages, name) {
			a.Packages = append(a.Packages, name)
		}
	}
	slices.Sort(a.Packages)
	return a
}

// builds counts the rootfs this process built or flattened.
var builds atomic.Int64

// Builds is how many rootfs this process built or flattened into a cache.
func Builds() int64 { return builds.Load() }

// Entry is one rootfs in a cache dir.
type Entry struct {
	// Name is its name in the cache dir: <key>.<n> for a built rootfs,
	// image-<digest>-<overlay> for a flattened image; Dir its path.
	Name string `json:"name"`
	Dir  string `json:"dir"`
	// Kind is "built", "image", or "unknown" for a dir without a hold
	// file (an older mcp-exec's, or someone's), which is never removed.
	Kind string `json:"kind"`
	// Current: a server with the settings it was built for would use it.
	// A built rootfs that is not current was replaced after a host file
	// it came from changed.
	Current bool `json:"current"`
	// About says what it holds; nil when unknown.
	About *About `json:"about,omitempty"`
	// Bytes is the disk it takes (its files' blocks, each inode once).
	Bytes int64 `json:"bytes"`
	// LastUsed is when a process last took it or let it go.
	LastUsed time.Time `json:"last_used"`
	// Holders is how many open files hold it (a process each, mostly):
	// while it is not 0, it is in use and never removed.
	Holders int `json:"holders"`
}

// InUse says whether a process holds the entry.
func (e Entry) InUse() bool { return e.Holders > 0 }

// List lists the rootfs in cacheDir, least recently used first; a cache
// dir that does not exist holds none.
func List(cacheDir string) ([]Entry, error) {
	des, err := os.ReadDir(cacheDir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing the rootfs cache: %w", err)
	}
	locks := flockedInodes()
	current := map[string]string{}
	for _, de := range des {
		if de.Type()&fs.ModeSymlink != 0 {
			if target, err := os.Readlink(filepath.Join(cacheDir, de.Name())); err == nil {
				current[de.Name()] = target
			}
		}
	}
	var list []Entry
	for _, de := range des {
		if !de.IsDir() || isLeftover(de.Name()) {
			continue
		}
		e := Entry{Name: de.Name(), Dir: filepath.Join(cacheDir, de.Name()), Kind: "unknown"}
		suffix := ""
		if key, _, ok := parseGeneration(e.Name); ok {
			e.Kind, suffix, e.Current = "built", manifestSuffix, current[key] == e.Name
		} else if strings.HasPrefix(e.Name, imagePrefix) {
			e.Kind, suffix, e.Current = "image", holdSuffix, true
		}
		e.Bytes = diskUsage(e.Dir)
		if suffix != "" {
			fi, err := os.Stat(e.Dir + suffix)
			if err != nil {
				e.Kind, suffix = "unknown", ""
			} else {
				e.LastUsed = fi.ModTime()
				e.Bytes += fi.Size()
				e.Holders = locks[inodeOf(fi)]
			}
		}
		if e.Kind == "unknown" {
			if fi, err := de.Info(); err == nil {
				e.LastUsed = fi.ModTime()
			}
		}
		if data, err := os.ReadFile(e.Dir + aboutSuffix); err == nil {
			var a About
			if json.Unmarshal(data, &a) == nil {
				e.About = &a
			}
		} else if e.Kind == "built" {
			e.About = aboutFromManifest(e.Dir + manifestSuffix)
		}
		list = append(list, e)
	}
	slices.SortStableFunc(list, func(a, b Entry) int { return a.LastUsed.Compare(b.LastUsed) })
	return list, nil
}

// PruneOptions say which of the entries no process holds Prune removes.
// The zero value removes them all.
type PruneOptions struct {
	// Keep keeps the Keep most recently used of them.
	Keep int
	// OlderThan, when > 0, removes only those last used longer ago.
	OlderThan time.Duration
	// MaxBytes, when > 0, removes only while the cache as a whole (the
	// entries in use included) takes more than this, least recently used
	// first.
	MaxBytes int64
	// DryRun says what would be removed, removing nothing.
	DryRun bool
}

// Prune removes, least recently used first, the rootfs of cacheDir that
// no process holds and o selects, with the leftovers of killed builds. It
// waits for builds under way (the cache's lock), and returns what it
// removed. An entry a process takes meanwhile stays: the removal takes
// each entry's hold file exclusively or leaves it.
func Prune(ctx context.Context, cacheDir string, o PruneOptions) ([]Entry, error) {
	if _, err := os.Stat(cacheDir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	c := generations(cacheDir)
	unlock, err := c.lock(ctx)
	if err != nil {
		return nil, fmt.Errorf("pruning the rootfs cache: %w", err)
	}
	defer unlock()
	if !o.DryRun {
		if err := c.tidy(); err != nil {
			return nil, fmt.Errorf("pruning the rootfs cache: %w", err)
		}
	}
	list, err := List(cacheDir)
	if err != nil {
		return nil, err
	}
	var total int64
	var unused []Entry
	for _, e := range list {
		total += e.Bytes
		if !e.InUse() && e.Kind != "unknown" {
			unused = append(unused, e)
		}
	}
	unused = unused[:max(0, len(unused)-o.Keep)] // oldest first: the newest are kept
	var removed []Entry
	for _, e := range unused {
		if o.MaxBytes > 0 && total <= o.MaxBytes {
			break
		}
		if o.OlderThan > 0 && time.Since(e.LastUsed) < o.OlderThan {
			continue
		}
		ok := true
		if !o.DryRun {
			if ok, err = removeEntry(cacheDir, e); err != nil {
				return removed, fmt.Errorf("pruning the rootfs cache: %w", err)
			}
		}
		if ok {
			removed = append(removed, e)
			total -= e.Bytes
		}
	}
	return removed, nil
}

// removeEntry removes e unless a process holds it; a built rootfs that was
// current takes its key's link with it. The caller holds the lock.
func removeEntry(cacheDir string, e Entry) (bool, error) {
	c := cache{dir: cacheDir, suffix: holdSuffix}
	if e.Kind == "built" {
		c.suffix = manifestSuffix
	}
	ok, err := c.removeUnused(e.Name)
	if !ok || err != nil || e.Kind != "built" {
		return ok, err
	}
	key, _, _ := parseGeneration(e.Name)
	link := filepath.Join(cacheDir, key)
	if target, err := os.Readlink(link); err == nil && target == e.Name {
		if err := os.Remove(link); err != nil {
			return true, fmt.Errorf("removing %s: %w", link, err)
		}
	}
	return true, nil
}

// diskUsage is the disk the files under dir take: their blocks, each inode
// once (a rootfs has hard links from no one, but an operator may).
func diskUsage(dir string) int64 {
	var n int64
	seen := map[uint64]bool{}
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return nil
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			n += fi.Size()
			return nil
		}
		if st.Nlink > 1 && !fi.IsDir() {
			if seen[st.Ino] {
				return nil
			}
			seen[st.Ino] = true
		}
		n += st.Blocks * 512
		return nil
	})
	return n
}

// inode names a file as /proc/locks does.
type inode struct {
	major, minor uint32
	ino          uint64
}

func inodeOf(fi fs.FileInfo) inode {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return inode{}
	}
	return inode{unix.Major(st.Dev), unix.Minor(st.Dev), st.Ino}
}

// flockedInodes counts the flock(2) locks on each file, as the kernel
// lists them in /proc/locks. Reading it takes no lock: listing the cache
// never keeps a server from taking an entry.
func flockedInodes() map[inode]int {
	m := map[inode]int{}
	f, err := os.Open("/proc/locks")
	if err != nil {
		return m
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 1: FLOCK  ADVISORY  READ  1234 08:01:5678 0 EOF
		// A waiting lock's line has "->" after the number.
		fields := strings.Fields(sc.Text())
		if len(fields) > 1 && fields[1] == "->" {
			continue
		}
		if len(fields) < 6 || fields[1] != "FLOCK" {
			continue
		}
		parts := strings.Split(fields[5], ":")
		if len(parts) != 3 {
			continue
		}
		maj, err1 := strconv.ParseUint(parts[0], 16, 32)
		mnr, err2 := strconv.ParseUint(parts[1], 16, 32)
		ino, err3 := strconv.ParseUint(parts[2], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			continue
		}
		m[inode{uint32(maj), uint32(mnr), ino}]++
	}
	return m
}
