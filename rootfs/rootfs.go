// Package rootfs makes the read-only root filesystem every sandbox runs on,
// and says which one a configuration asks for. It knows nothing of
// containers: it builds, finds or flattens a directory and returns its path;
// whether Python runs there only a sandbox can tell, and the caller's is
// passed in (Prove).
//
// Its rooms:
//   - open.go: which rootfs (Open). An operator's dir (MCP_EXEC_ROOTFS), a
//     container image (MCP_EXEC_ROOTFS_IMAGE) or, by default, one built from
//     the host's python3; where a packages dir (MCP_EXEC_PACKAGES_DIR) is
//     mounted in it; and what is proven in a sandbox, when.
//   - build.go, elf.go, dpkg.go, packages.go, shell.go: Build, the default
//     rootfs from the host's python3: the interpreter, the shared libraries
//     it and its extension modules load, the standard library, and a
//     skeleton /etc. Nothing is downloaded. Options add, from the host's
//     Debian packages, Python packages (numpy, pandas, ...: the python3-*
//     packages, their python3-* dependencies, the data packages those need,
//     and the libraries of all of them) and a shell (busybox-static).
//     Describe says what a configuration offers, for the tool's description.
//   - python.go, options.go: the host interpreter (FindPython) and Options,
//     which together key a built rootfs.
//   - ensure.go, manifest.go: Ensure, a built rootfs cached by its key and
//     built anew when a host file it was built from changes.
//   - image.go, overlay.go: FlattenImage, an image's layers applied by
//     package image, the sandbox's own files laid over them, cached by the
//     image's digest.
//   - cache.go: the cache dir Ensure and FlattenImage share: one lock,
//     entries written once and held by every process that uses them.
//   - entries.go: what the cache holds (List) and removing, least recently
//     used first, what no process holds (Prune).
//   - rootfs.go, packagesdir.go: Check says whether a dir is a usable
//     rootfs, CheckPackagesDir whether a dir of packages meant to be
//     mounted at PackagesDirMountPoint loads in it.
//
// Invariants a maintainer must keep:
//   - Every host path keeps its name in the rootfs, and every symlink met on
//     the way to it (merged-/usr's /lib64 -> usr/lib64, libz.so.1 ->
//     libz.so.1.2.13) is a symlink there too: Python finds its prefix from
//     its executable's path, and the loader finds libraries by the names the
//     host's ELF files give.
//   - Libraries are found by reading the ELF files (DT_NEEDED, PT_INTERP,
//     DT_RPATH/DT_RUNPATH, ld.so.conf, the default dirs), never from a list:
//     a missing library fails the build, naming it and what needs it.
//   - The rootfs is shared by every call and mounted read-only, so it holds,
//     ready-made, everything the runtime mounts onto (MountPoints,
//     PackagesDirMountPoint) and nothing of the host's /etc; it is readable
//     by uid 65532, and holds no setuid, setgid, group- or world-writable
//     file: every file gets image.FileMode, built or flattened.
//   - A rootfs appears complete or not at all: it is built in a temp dir next
//     to its final path and renamed; a failed build leaves nothing behind.
//   - A cached rootfs is keyed by its interpreter and its normalized Options
//     (Options.Key) and never modified; Ensure builds it at most once, even
//     across processes, until a host file it was built from changes (its
//     manifest says which). Then Ensure builds a new generation next to it
//     and swaps the key's link; the old one stays until no process that was
//     handed it is alive.
//   - Nothing about the host beyond what Python needs goes into the rootfs:
//     the manifest lives next to it in the cache, never inside.
//   - Packages are taken by dpkg's file lists, never by scanning the host's
//     site dirs: the rootfs holds the named packages and what they depend
//     on, not whatever else the host installed. Their list files are in the
//     manifest, so an upgrade, a reinstall or a removal rebuilds, and a
//     removed package then fails with the apt-get line that brings it back.
//   - A link into /etc (Debian's alternatives: libblas.so.3) is never
//     reproduced: /etc stays the skeleton, and the file the link leads to is
//     copied under the link's name. /etc files a package needs are written
//     from constants (matplotlibrc), never copied from the host.
//   - Python is proven to run in a real sandbox before a rootfs is used: a
//     rootfs built here once, before it enters the cache (never again at
//     start); a rootfs, image or packages dir of the operator's making at
//     every start, with the packages dir mounted (Open).
//   - Every rootfs has the empty PackagesDirMountPoint, with real dirs all
//     the way, so that a packages dir can be mounted without creating
//     anything in the shared rootfs; and the empty policy.DataDir, for a
//     data dir.
package rootfs

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	securejoin "github.com/cyphar/filepath-securejoin"

	"github.com/inhuman/mcp-exec/policy"
)

// PythonPath is the interpreter's path inside every rootfs this package builds.
const PythonPath = "/usr/bin/python3"

// MountPoints are the empty dirs every rootfs has, so that the runtime never
// has to create anything inside the shared, read-only rootfs. /code is the
// init's small tmpfs holding the script, /.mcp-exec where the init itself
// is bound. There is no /sys: it is not mounted.
func MountPoints() []string {
	return []string{"/proc", "/dev", "/tmp", "/code", "/.mcp-exec"}
}

// madeMountPoints are the empty dirs every rootfs this package makes has:
// MountPoints, and policy.DataDir, where an operator's data dir is
// mounted. Check does not ask an operator's rootfs for the last: it is
// needed only with a data dir, and Open says so then.
func madeMountPoints() []string {
	return append(MountPoints(), policy.DataDir)
}

// DefaultCacheDir is where Ensure keeps rootfs builds when the user names none:
// /var/cache/mcp-exec/rootfs for root, else $XDG_CACHE_HOME/mcp-exec/rootfs or
// ~/.cache/mcp-exec/rootfs. It is empty when the user has no home to cache in.
func DefaultCacheDir() string {
	if os.Geteuid() == 0 {
		return "/var/cache/mcp-exec/rootfs"
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		return ""
	}
	return filepath.Join(dir, "mcp-exec", "rootfs")
}

// Check verifies that dir is a usable rootfs: that it has the interpreter at
// PythonPath, the mount points and /etc/passwd. Its error names everything
// that is missing, so that a wrong MCP_EXEC_ROOTFS is fixed in one go.
func Check(dir string) error {
	fi, err := os.Stat(dir)
	if err != nil {
		return fmt.Errorf("rootfs %s is not usable: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("rootfs %s is not usable: not a directory", dir)
	}

	var problems []string
	if p, err := resolveIn(dir, PythonPath); err != nil {
		problems = append(problems, fmt.Sprintf("no interpreter at %s (%v)", PythonPath, err))
	} else if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		problems = append(problems, fmt.Sprintf("%s is not an executable file", PythonPath))
	}
	for _, mp := range MountPoints() {
		fi, err := os.Lstat(filepath.Join(dir, mp))
		switch {
		case err != nil:
			problems = append(problems, fmt.Sprintf("no mount point %s", mp))
		case !fi.IsDir():
			// Not even a symlink to one: the runtime must not follow
			// links out of the rootfs when it mounts.
			problems = append(problems, fmt.Sprintf("mount point %s is not a directory", mp))
		}
	}
	if p, err := resolveIn(dir, "/etc/passwd"); err != nil {
		problems = append(problems, fmt.Sprintf("no /etc/passwd (%v)", err))
	} else if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		problems = append(problems, "/etc/passwd is not a file")
	}
	if below := MountsBelow(dir); len(below) > 0 {
		// The runtime binds the root recursively and makes only its top
		// read-only: a mount below it would come in writable.
		problems = append(problems, fmt.Sprintf("it has mounts below it (%s), which the sandbox would see writable: unmount them",
			strings.Join(below, ", ")))
	}
	if len(problems) > 0 {
		return fmt.Errorf("rootfs %s is not usable: %s", dir, strings.Join(problems, "; "))
	}
	return nil
}

// MountsBelow lists the mount points strictly below dir in this process's
// mount namespace.
func MountsBelow(dir string) []string {
	real, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return nil
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var below []string
	for _, line := range strings.Split(string(data), "\n") {
		// id parent maj:min root mountpoint ...; the mount point escapes
		// blanks as \040.
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(f[4])
		if mp != real && within(mp, real) {
			below = append(below, mp)
		}
	}
	return below
}

// resolveIn resolves p as a process chrooted into root would, following
// symlinks without ever leaving root, and returns the host path it names.
// Absolute links in a rootfs point into the rootfs, not into the host.
func resolveIn(root, p string) (string, error) {
	full, err := securejoin.SecureJoin(filepath.Clean(root), p)
	if err != nil {
		return "", err
	}
	if _, err := os.Lstat(full); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("%s does not exist", p)
		}
		return "", err
	}
	return full, nil
}
